"""`gym <group> <command> [flags] [+key=value ...]` (also `ng`): NeMo-Gym's newer command spelling.

Each command runs the same implementation as its `ng_*` name, with the same `+key=value` arguments:

    gym env start        = ng_run                   start the fleet and supervise it
    gym env validate     = ng_run +dry_run=true     validate the config; start nothing
    gym env status       = ng_status                the running fleet's servers
    gym env test         = ng_test                  one environment's tests (+ conformance)
    gym env test-all     = ng_test_all              every environment's tests
    gym env init         = ng_init_resources_server scaffold a new environment
    gym eval run         = ng_collect_rollouts      collect rollouts from a running fleet
    gym eval e2e         = ng_e2e_collect_rollouts  start a fleet, collect, stop it
    gym eval aggregate   = ng_aggregate_rollouts    aggregate metrics of a rollouts file
    gym eval profile     = ng_reward_profile        per-task pass@k / mean / variance
    gym eval reverify    = ng_reverify              re-score stored rollouts; which rewards changed, and why
    gym dataset collate  = ng_prepare_data          validate and collate datasets
    gym config dump      = ng_dump_config           print the resolved config

Flags, translated to `+key=value` arguments before the command runs:
    --config PATH            (repeatable, or comma-separated) +config_paths=[...]
    --resources-server NAME  for `env test` / `env init`: +entrypoint=resources_servers/NAME;
                             elsewhere: adds resources_servers/NAME/configs/NAME.yaml to the config paths
    --model-type NAME[/FLAVOR]  adds responses_api_models/NAME/configs/<FLAVOR or NAME>.yaml
    --model NAME, -m NAME    +policy_model_name=NAME
    --model-url URL          +policy_base_url=URL
    --model-api-key KEY      +policy_api_key=KEY
    --json                   +json=true
`gym <group> <command> --help` prints that command's own help.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from gymfleet.errors import did_you_mean

COMMANDS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("env", "start"): ("gymfleet.cli.run:main", ()),
    ("env", "validate"): ("gymfleet.cli.run:main", ("+dry_run=true",)),
    ("env", "status"): ("gymfleet.cli.status:main", ()),
    ("env", "test"): ("gymfleet.cli.test:main", ()),
    ("env", "test-all"): ("gymfleet.cli.test:main_all", ()),
    ("env", "init"): ("gymfleet.cli.init_server:main", ()),
    ("eval", "run"): ("gymfleet.cli.collect:main", ()),
    ("eval", "e2e"): ("gymfleet.cli.e2e_collect:main", ()),
    ("eval", "aggregate"): ("gymfleet.cli.aggregate:main", ()),
    ("eval", "profile"): ("gymfleet.cli.reward_profile:main", ()),
    ("eval", "reverify"): ("gymfleet.cli.reverify:main", ()),
    ("dataset", "collate"): ("gymfleet.cli.prepare_data:main", ()),
    ("config", "dump"): ("gymfleet.cli.dump_config:main", ()),
}
"""(group, command) -> (`module:function` of the implementation, arguments it always gets)."""
ENTRYPOINT_COMMANDS = {("env", "test"), ("env", "init")}
"""Commands for which `--resources-server NAME` names the environment folder rather than a config to load."""
VALUE_FLAGS = {"--model": "policy_model_name", "-m": "policy_model_name", "--model-url": "policy_base_url",
               "--model-api-key": "policy_api_key"}


class UsageError(Exception):
    """A command line `gym` cannot route; the message says what to type instead."""


def translate(command: tuple[str, str], args: list[str]) -> list[str]:
    """The `+key=value` arguments for `args` (flags translated, everything else passed on in order).

    Raises:
        UsageError: a flag without its value, or an unknown `--flag`.
    """
    config_paths: list[str] = []
    out: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        flag, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, False, "")
        takes_value = flag in VALUE_FLAGS or flag in ("--config", "--resources-server", "--model-type")
        if takes_value:
            if has_inline:
                value = inline
            elif index + 1 < len(args):
                index += 1
                value = args[index]
            else:
                raise UsageError(f"{flag} needs a value")
            if flag == "--config":
                config_paths += [path for path in value.split(",") if path]
            elif flag == "--resources-server":
                if command in ENTRYPOINT_COMMANDS:
                    out.append(f"+entrypoint=resources_servers/{value}")
                else:
                    config_paths.append(f"resources_servers/{value}/configs/{value}.yaml")
            elif flag == "--model-type":
                name, _, flavor = value.partition("/")
                config_paths.append(f"responses_api_models/{name}/configs/{flavor or name}.yaml")
            else:
                out.append(f"+{VALUE_FLAGS[flag]}={value}")
        elif flag == "--json":
            out.append("+json=true")
        elif arg in ("-h", "--help"):
            out.append("--help")
        elif arg.startswith("-"):
            known = [*VALUE_FLAGS, "--config", "--resources-server", "--model-type", "--json", "--help"]
            raise UsageError(f"unknown flag {arg!r} for gym {' '.join(command)}.{did_you_mean(flag, known)}")
        else:
            out.append(arg)
        index += 1
    if config_paths:
        out = [token for token in out if not token.startswith("+config_paths=")] + [
            _merged_config_paths(config_paths, out)
        ]
    return out


def _merged_config_paths(paths: list[str], tokens: list[str]) -> str:
    """One `+config_paths=[...]` token with the paths of an explicit `+config_paths=[...]` first."""
    for token in tokens:
        if token.startswith("+config_paths="):
            given = token.split("=", 1)[1].strip().strip("[]")
            paths = [p.strip() for p in given.split(",") if p.strip()] + paths
    return f"+config_paths=[{','.join(dict.fromkeys(paths))}]"


def resolve(argv: list[str]) -> tuple[Callable[[list[str]], None], list[str]]:
    """`(implementation's main, its arguments)` for a `gym` command line.

    Raises:
        UsageError: an unknown group or command (with a did-you-mean), or one not available yet.
    """
    groups = sorted({group for group, _ in COMMANDS})
    group = argv[0]
    if group not in groups:
        raise UsageError(f"unknown command group {group!r}.{did_you_mean(group, groups)} Groups: {', '.join(groups)}")
    commands = sorted(name for g, name in COMMANDS if g == group)
    if len(argv) < 2 or argv[1].startswith("-"):
        raise UsageError(f"gym {group} needs a command: {', '.join(commands)}")
    name = argv[1]
    if (group, name) not in COMMANDS:
        raise UsageError(f"unknown command 'gym {group} {name}'.{did_you_mean(name, commands)} "
                         f"Commands of {group}: {', '.join(commands)}")
    target, fixed = COMMANDS[(group, name)]
    module_name, function = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise UsageError(f"'gym {group} {name}' is not yet available in gymfleet") from None
    return getattr(module, function), [*fixed, *translate((group, name), argv[2:])]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        sys.exit(0)
    try:
        command, args = resolve(argv)
    except UsageError as exc:
        print(f"error: {exc}\nSee `gym --help`.", file=sys.stderr)
        sys.exit(2)
    command(args)


if __name__ == "__main__":
    main()
