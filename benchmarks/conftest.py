import sys
from pathlib import Path

# The recipe generators are shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
