"""Reading source files without running them: safe reads, parsing under guard, the index the source rules query, paths and discovery. No torch."""
