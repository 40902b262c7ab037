"""NeMo-Gym's prompt files (`nemo_gym.prompt`): a YAML `{user, system?}` of `{field}` templates, filled from a row.

`load_prompt_config(path)` reads and validates one (cached; a relative path is found under the working directory,
else the folder's tree: `gymfleet.serving.nemo_gym_paths`),
`fill_prompt(config, row)` gives the messages (`KeyError` naming the missing field and the row's fields), and
`apply_prompt_to_row(config, row)` returns a copy of the row whose `responses_create_params.input` is those messages
(its other parameters kept).
"""

from __future__ import annotations

import functools
from typing import Any

import yaml
from pydantic import BaseModel

from gymfleet.serving.nemo_gym_paths import resolve_under_cwd_or_install


class PromptConfig(BaseModel):
    """A prompt file: the `user` template and, optionally, the `system` one."""

    user: str
    system: str | None = None


@functools.lru_cache(maxsize=64)
def load_prompt_config(path: str) -> PromptConfig:
    """The prompt file at `path` (a relative one found as NeMo-Gym finds it: `resolve_under_cwd_or_install`),
    validated."""
    return PromptConfig.model_validate(yaml.safe_load(resolve_under_cwd_or_install(path).read_text()))


def fill_prompt(prompt_config: PromptConfig, row: dict[str, Any]) -> list[dict[str, str]]:
    """The system (if any) and user messages, their `{field}` placeholders filled from `row`'s top-level fields.

    Raises:
        KeyError: a placeholder names a field the row does not have.
    """
    templates = [("system", prompt_config.system), ("user", prompt_config.user)]
    try:
        return [{"role": role, "content": template.format_map(row)} for role, template in templates
                if template is not None]
    except KeyError as exc:
        raise KeyError(f"the prompt template uses field {exc} but the row has only {sorted(row)}") from None


def apply_prompt_to_row(row: dict[str, Any], prompt_config: PromptConfig) -> dict[str, Any]:
    """A copy of `row` whose `responses_create_params.input` is the filled prompt (other parameters kept)."""
    params = row.get("responses_create_params")
    params = dict(params) if isinstance(params, dict) else {}
    params["input"] = fill_prompt(prompt_config, row)
    return {**row, "responses_create_params": params}
