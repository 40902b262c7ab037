"""`ng_dump_config "+config_paths=[...]"`: print the resolved config as YAML, secrets hidden.

Ports left unset are chosen when `ng_run` starts the fleet, so they are not known here: such a port is printed
`null  # assigned at start`, and a value built from it (`http://127.0.0.1:${x.port}/v1`) shows
`<port assigned at start>` where the port goes, never `:None`.
"""

from __future__ import annotations

import re

from gymfleet.cli import command, command_config

UNASSIGNED_PORT = "<port assigned at start>"
_NONE_PORT = re.compile(r"(?<=[\w\]]):None(?=[/?#\s]|$)")
"""`:None` right after a host name or address: a `${...port}` interpolated before the port was chosen."""
_NULL_PORT_LINE = re.compile(r"^(\s*(?:- )?port: null)$", re.MULTILINE)


def _dump(argv: list[str]) -> int:
    config = command_config(argv, "ng_dump_config", ())
    print(render(config.to_yaml(hide_secrets=True)), end="")
    return 0


def render(text: str) -> str:
    """The dumped YAML with unassigned ports said as such (see the module docstring)."""
    text = _NULL_PORT_LINE.sub(r"\1  # assigned at start", text)
    return _NONE_PORT.sub(":" + UNASSIGNED_PORT, text)


main = command(_dump, __doc__)


if __name__ == "__main__":
    main()
