"""Where the suite's files are, for tests in any folder of tests/."""
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"  # schemas the outputs are validated against
MODELS = TESTS / "models"  # model files the tests check as a user would
