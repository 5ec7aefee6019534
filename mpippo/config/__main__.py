"""python -m mpippo.config [--markdown]: every key with its default and help (docs/config.md's table)."""
from mpippo.config.schema import describe
from mpippo.toolcli import Parser, exit_process, run


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m mpippo.config", description=__doc__.split(": ", 1)[1])
    parser.add_argument("--markdown", action="store_true", help="docs/config.md's table instead of YAML")
    print(describe(markdown=parser.parse_args(argv).markdown))  # (a misspelled --markdown: refused, not YAML)
    return 0


exit_process(run("config", main))
