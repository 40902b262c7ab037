"""What token capture costs the vLLM model server per model call, in process: `capture_tokens` on a vLLM answer.

In training mode (`return_token_id_information`) the model server reads every generated token's id and logprob from
the upstream's answer (`choices[0].logprobs.content`, `token_id:<int>` names) and checks the prompt's ids from
`/tokenize` before anyone trains on them (`responses_api_models/vllm_model/tokens.py`). That is work per token, on
every model call of every rollout, in the one process that fronts the policy. This bench times it on answers of
several sizes (prompt + generated tokens), the fastest of alternating rounds; `--baseline DIR` times another
checkout's `tokens.py` (say, of main: `git archive main | tar -x -C DIR`) in a process of its own, in the same rounds.

    python bench/token_capture.py [--sizes 200+50 8000+2000 32000+4000] [--rounds 5] [--baseline DIR]

Prints one table: µs per call for each size, this checkout and the baseline, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import timeit
from pathlib import Path

CHECKOUT_ENV = "TOKEN_CAPTURE_CHECKOUT"
"""Set for the process that times another checkout: its code is imported instead of this one's."""
ROOT = Path(os.environ.get(CHECKOUT_ENV) or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))


def _answer(prompt_tokens: int, generated: int) -> tuple[dict, list[int]]:
    """A vLLM chat completion with logprobs named by token id, and the prompt's ids as `/tokenize` gives them."""
    rng = random.Random(prompt_tokens * 7919 + generated)
    entries = [{"token": f"token_id:{rng.randrange(150_000)}", "logprob": -rng.random() * 4, "bytes": [32],
                "top_logprobs": []} for _ in range(generated)]
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "..."},
                               "logprobs": {"content": entries}, "finish_reason": "stop"}]}
    return completion, [rng.randrange(150_000) for _ in range(prompt_tokens)]


def time_calls(sizes: list[tuple[int, int]], number: int) -> dict[str, float]:
    """µs per `capture_tokens` call for each size, in this process (the fastest of 3 repeats)."""
    from responses_api_models.vllm_model.tokens import capture_tokens

    loop = asyncio.new_event_loop()
    out = {}
    for prompt_tokens, generated in sizes:
        completion, prompt = _answer(prompt_tokens, generated)

        async def tokenize(prompt=prompt):
            return prompt

        def call(completion=completion, tokenize=tokenize):
            return loop.run_until_complete(capture_tokens(completion, tokenize, url="http://upstream"))

        fields = call()
        assert len(fields["generation_token_ids"]) == generated and fields["prompt_token_ids"] == prompt
        best = min(timeit.repeat(call, number=number, repeat=3)) / number
        out[f"{prompt_tokens}+{generated}"] = best * 1e6
    loop.close()
    return out


def measured(sizes: list[tuple[int, int]], number: int, checkout: Path | None) -> dict[str, float]:
    """`time_calls` in a process of its own importing `checkout`'s code (None: this checkout's)."""
    env = {**os.environ, "PYTHONPATH": str(checkout or ROOT)}
    env.pop(CHECKOUT_ENV, None)
    if checkout is not None:
        env[CHECKOUT_ENV] = str(checkout)
    command = [sys.executable, str(Path(__file__).resolve()), "--json", "--number", str(number),
               "--sizes", *(f"{p}+{g}" for p, g in sizes)]
    return json.loads(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout)


def parse_size(text: str) -> tuple[int, int]:
    prompt, _, generated = text.partition("+")
    if not (prompt.isdigit() and generated.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: write prompt+generated token counts, e.g. 8000+2000")
    return int(prompt), int(generated)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+",
                        default=[(200, 50), (2000, 500), (8000, 2000), (32000, 4000)],
                        help="prompt+generated token counts, one answer each")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per checkout (fastest kept)")
    parser.add_argument("--number", type=int, default=20, help="calls per timing")
    parser.add_argument("--baseline", type=Path, help="another checkout whose tokens.py is timed beside this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # `measured`: one process's numbers
    args = parser.parse_args()
    if args.json:
        print(json.dumps(time_calls(args.sizes, args.number)))
        return
    trees = {"this": None, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    best: dict[str, dict[str, float]] = {tree: {} for tree in trees}
    for round_ in range(args.rounds):
        for tree in (list(trees) if round_ % 2 == 0 else list(reversed(trees))):
            for size, us in measured(args.sizes, args.number, trees[tree]).items():
                best[tree][size] = min(best[tree].get(size, float("inf")), us)
    load = os.getloadavg()[0]
    print(f"\ncapture_tokens per model call, fastest of {args.rounds} alternating rounds; {os.cpu_count()} cores, "
          f"load average {load:.1f}" + (f"; baseline: {args.baseline}" if args.baseline else ""))
    header = "| prompt + generated tokens | this µs |" + (" baseline µs | baseline / this |" if args.baseline else "")
    print("\n" + header)
    print("|---:|---:|" + ("---:|---:|" if args.baseline else ""))
    for size in best["this"]:
        row = f"| {size} | {best['this'][size]:.0f} |"
        if args.baseline:
            row += f" {best['baseline'][size]:.0f} | {best['baseline'][size] / best['this'][size]:.2f} |"
        print(row)


if __name__ == "__main__":
    main()
