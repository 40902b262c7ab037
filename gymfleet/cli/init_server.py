"""`ng_init_resources_server +entrypoint=resources_servers/<name> [+domain=other]`: scaffold a new environment.

Writes `resources_servers/<name>/` (relative to the current directory, normally the repository root):

- `app.py`: a working environment (one boxed answer graded against the row's `expected_answer`) whose module
  docstring has every section the house style and the conformance test want;
- `configs/<name>.yaml`: the resources server (`domain: <domain>`) and a `<name>_simple_agent` with the example
  dataset, loadable by `ng_run`;
- `data/example.jsonl`: five example rows;
- `tests/test_<name>.py`: a score table and real-server tests;
- `__init__.py`, `tests/__init__.py`.

The result passes `tests/test_conformance.py` and `ng_run +dry_run=true` as generated; run `ng_test
+entrypoint=resources_servers/<name>` to see it. An existing folder is never overwritten (exit code 2).
Next steps, printed at the end: edit `score()` and the rows, then `ng_prepare_data` to write
`data/example_metrics.json`.
"""

from __future__ import annotations

import json
import keyword
from importlib import resources
from pathlib import Path
from string import Template

from gymfleet.cli import command, command_config
from gymfleet.errors import ConfigError
from gymfleet.serving.resources import DOMAINS

EXAMPLES = (
    ("What is the capital of France?", "Paris"),
    ("Which planet of the solar system is known as the Red Planet?", "Mars"),
    ("What is the chemical symbol for gold?", "Au"),
    ("How many sides does a hexagon have? Answer with a number.", "6"),
    ("Who wrote the play 'Romeo and Juliet'? Give the surname only.", "Shakespeare"),
)
SYSTEM_PROMPT = "Answer the question. Put your final answer, and nothing else, in \\boxed{}."


def camel_case(name: str) -> str:
    """`my_env` -> `MyEnv` (the prefix of the four class names)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def target_folder(entrypoint: object) -> tuple[Path, str]:
    """`(folder, name)` for `+entrypoint=resources_servers/<name>`.

    Raises:
        ConfigError: not a `resources_servers/<name>` path, or `<name>` is not a lowercase Python identifier.
    """
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise ConfigError("entrypoint is required", path="entrypoint",
                          hint="ng_init_resources_server +entrypoint=resources_servers/<name>")
    folder = Path(entrypoint.strip().rstrip("/"))
    name = folder.name
    if folder.parent.name != "resources_servers":
        raise ConfigError(f"entrypoint {entrypoint!r} is not a resources_servers/<name> folder", path="entrypoint",
                          hint=f"Use +entrypoint=resources_servers/{name or '<name>'}.")
    if not name.isidentifier() or keyword.iskeyword(name) or name != name.lower() or name.startswith("_"):
        raise ConfigError(
            f"environment name {name!r} must be a lowercase Python identifier (letters, digits, underscores)",
            path="entrypoint", hint="It names the folder, the config key and the import path, e.g. my_env.",
        )
    return folder, name


def render(name: str, domain: str) -> dict[str, str]:
    """The scaffold's files, by path relative to the environment folder."""
    values = {"name": name, "Camel": camel_case(name), "domain": domain}
    templates = resources.files("gymfleet.cli.templates")

    def fill(template: str) -> str:
        return Template(templates.joinpath(template).read_text()).substitute(values)

    rows = [
        {
            "responses_create_params": {"input": [{"role": "system", "content": SYSTEM_PROMPT},
                                                  {"role": "user", "content": question}]},
            "expected_answer": answer,
            "uuid": f"{name}-example-{index}",
        }
        for index, (question, answer) in enumerate(EXAMPLES)
    ]
    return {
        "__init__.py": "",
        "app.py": fill("app.py.txt"),
        f"configs/{name}.yaml": fill("config.yaml.txt"),
        "data/example.jsonl": "".join(json.dumps(row) + "\n" for row in rows),
        "tests/__init__.py": "",
        f"tests/test_{name}.py": fill("test_app.py.txt"),
    }


def scaffold(folder: Path, name: str, domain: str = "other") -> list[Path]:
    """Write the scaffold into `folder` (which must not exist); return the files written.

    Raises:
        ConfigError: `folder` exists, or `domain` is not one of NeMo-Gym's domains.
    """
    if domain not in DOMAINS:
        raise ConfigError(f"domain {domain!r} is not one of {', '.join(DOMAINS)}", path="domain")
    if folder.exists():
        raise ConfigError(f"{folder} already exists; ng_init_resources_server never overwrites a folder",
                          path="entrypoint", hint="Pick another name, or remove the folder first.")
    files = render(name, domain)
    folder.mkdir(parents=True)
    written = []
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def _run(argv: list[str]) -> int:
    config = command_config(argv, "ng_init_resources_server", ("domain",))
    folder, name = target_folder(config.data.get("entrypoint"))
    written = scaffold(folder, name, str(config.data.get("domain", "other")))
    for path in written:
        print(f"wrote {path}")
    print(
        f"\nNext:\n"
        f"  ng_test +entrypoint={folder}        # its tests and the conformance test\n"
        f"  edit score() in {folder / 'app.py'} and the rows in {folder / 'data/example.jsonl'}\n"
        f"  ng_prepare_data \"+config_paths=[{folder / 'configs' / (name + '.yaml')}]\" "
        f"+output_dirpath=data/{name} +mode=example_validation   # writes data/example_metrics.json\n"
        f"  ng_run \"+config_paths=[responses_api_models/vllm_model/configs/vllm_model.yaml,"
        f"{folder / 'configs' / (name + '.yaml')}]\"",
        flush=True,
    )
    return 0


main = command(_run, __doc__)


if __name__ == "__main__":
    main()
