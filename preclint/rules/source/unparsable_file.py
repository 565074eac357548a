"""PCL599 unparsable-file: a file the source rules could not read as Python."""
from __future__ import annotations

from preclint.core.findings import Finding, Location
from preclint.rules.base import SourceRule


class UnparsableFile(SourceRule):
    code = "PCL599"
    name = "unparsable-file"
    summary = "A file could not be parsed (or decoded), so no source rule checked it."
    severity = "error"
    # Reported by the runner when parsing fails; shown unless explicitly ignored, so that a file never
    # passes the check silently because nothing could be read from it.
    after_suppressions = True
    reports_unreadable_files = True
    why = """
A file that does not parse is a file no rule looked at: without this finding, a syntax error would
make preclint report nothing and pass. The check goes on with the other files. A file whose text has
none of the words the selected rules look for (no `torch`, `allclose`, `eps`, ...) is not parsed at
all, as it cannot hold a finding; its syntax is left to Python and to your other linters.
"""
    example = """
def check(:
    torch.testing.assert_close(a, b)
"""
    fix = """
Fix the syntax error (or the encoding). If the file is meant to be broken (a fixture), exclude it
with `exclude` in `[tool.preclint]`, or ignore PCL599 for it in `per-file-ignores`.
"""
    valid = ("import torch\n\nok = torch.allclose(a, b)\n",)
    # the files hold words the rules look for, so they are parsed (see Why it matters)
    invalid = (
        "import torch\n\ndef f(:\n    return torch.cuda.amp.autocast()\n",
        "import torch\n\nok = torch.allclose(a.half(), b,\n",
    )

    @classmethod
    def unreadable_file(cls, path: str, message: str, line: int = 1, column: int = 1) -> Finding:
        return Finding(
            code=cls.code,
            name=cls.name,
            severity=cls.severity,
            message=message[0].upper() + message[1:] + ("" if message.endswith(".") else "."),
            fix="Fix the syntax error, or exclude the file.",
            location=Location(path, line, column),
        )
