"""python -m mpippo.config [--markdown]: every key with its default and help (docs/config.md's table)."""
import sys

from mpippo.config.schema import describe

print(describe(markdown="--markdown" in sys.argv))
