"""The float32 statistics pass and the analyses that read it (one analysis, one typed record)."""
