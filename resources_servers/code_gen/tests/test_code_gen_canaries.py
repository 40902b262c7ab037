"""code_gen's canaries and the class they defend: a program cannot pass by reading or forging expected outputs.

First line: expected outputs never enter the sandbox. Programs that search everywhere a sandboxed program can look
(the filesystem, their own and the supervisor's memory, /proc) for the row's expected outputs find none, while the
same searches do find a probe the test knows is there (so a search that reaches nothing cannot pass for one that
found nothing).
Second line: the canaries. Against a grader made leaky on purpose (it writes each batch's expected outputs into the
sandbox, as a sandbox-side comparator would), forgers generated from {how they learn their slot} x {how they read
the leak} x {how they emit the answer} pass every real test and are caught as `tests_tampered`; honest programs,
however they print, are never flagged."""

from __future__ import annotations

import itertools
import json
import random
import secrets

import pytest

from gymfleet.grading.canary import case_canaries
from resources_servers.code_gen.app import CodeGenServer
from resources_servers.code_gen.tests.conftest import fenced, served, verify


def secret_row(count: int = 3, fn_name: str | None = None) -> dict:
    """A row whose expected outputs no program can compute: random tokens, fresh per call."""
    inputs = [f"INPUT-{secrets.token_hex(8)}" for _ in range(count)]
    outputs = [f"EXPECT-{secrets.token_hex(8)}" for _ in range(count)]
    if fn_name:
        inputs, outputs = [json.dumps(text) for text in inputs], [json.dumps(text) for text in outputs]
    return {"responses_create_params": {"input": [{"role": "user", "content": "Print the secret."}]},
            "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs, "fn_name": fn_name}}}


# ------------------------------------------------------------------------------------------------ pure: CaseCanaries

@pytest.mark.parametrize("seed", range(40))
def test_canaries_split_back_and_flag_exactly_the_forgers(seed):
    rng = random.Random(seed)
    cases = [(str(rng.randrange(1000)), "") for _ in range(rng.randint(1, 6))]
    cases = [(stdin, str(2 * int(stdin))) for stdin, _ in cases]
    rest = cases[1:]
    canaries = case_canaries(cases, len(rest))
    batch = canaries.insert(rest, make=lambda case: case)
    assert len(batch) == len(rest) + 2 and len(set(canaries.positions)) == 2
    assert canaries.split(batch)[0] == rest and batch[canaries.positions[0]] == canaries.must_pass
    honest = [str(2 * int(stdin)) for stdin, _ in batch]
    assert canaries.tampered(honest, str.__eq__) is None
    assert "must-fail" in canaries.tampered([expected for _, expected in batch], str.__eq__)
    shuffled = honest[:]  # answers keyed on the slot, not the input: the copy of a case gets another case's answer
    shuffled[canaries.positions[0]] = "wrong"
    assert "must-pass" in canaries.tampered(shuffled, str.__eq__)
    cut = honest[: canaries.positions[0]]  # the run stopped before the must-pass canary (at the must-fail one)
    assert "did not run" in canaries.tampered(cut, str.__eq__)
    if len({expected for _, expected in cases}) > 1:  # the must-fail canary expects another case's real output
        assert canaries.must_fail[1] in {expected for _, expected in cases}


# ------------------------------------------------------------------------------------------------ first line

# Each search prints the first expected output it finds (or NOTFOUND) and whether it found its probe. The needles
# are built at run time, so the program's own text never matches them.
SEARCH_PRELUDE = """import gc, os, re, sys
WANT = re.compile("EXP" + "ECT-" + "[0-9a-f]{16}")
def first(texts):
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("latin-1")
        if isinstance(text, str):
            hit = WANT.search(text)
            if hit:
                return hit.group()
    return None
"""
SEARCHES = {
    "filesystem": """
def files():
    for top in ("/workspace", "/tmp", "/etc", "/usr/local", "/home", "/root", "/work", "/var", "/opt", "/srv", "/"):
        for root, dirs, names in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev", "/usr")]
            for name in names:
                try:
                    with open(os.path.join(root, name), "rb") as handle:
                        yield handle.read(1 << 20)
                except OSError:
                    pass
texts = list(files())
probe = any(("PRO" + "BE-" + "fs") in t.decode("latin-1") for t in texts)  # PROBE-fs: this program's own file
found = first(texts)
""",
    "memory": """
texts = [o for o in gc.get_objects() if isinstance(o, (str, bytes, dict, list, tuple))]
frame, strings = sys._getframe(), []
while frame is not None:
    strings += [repr(value) for value in frame.f_locals.values()] + [repr(frame.f_globals.get("request"))]
    frame = frame.f_back
strings += [repr(module.__dict__) for module in list(sys.modules.values())]
strings += [repr(o) for o in texts]
probe = any("INP" + "UT-" in s for s in strings)  # the inputs are in the supervisor's request
found = first(strings)
""",
    "proc": """
strings = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for leaf in ("cmdline", "environ", "fd/0", "mem"):
            try:
                with open(f"/proc/{pid}/{leaf}", "rb") as handle:
                    strings.append(handle.read(1 << 20))
            except OSError:
                pass
        try:
            strings += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
probe = any(b"INP" + b"UT-" in s for s in strings if isinstance(s, bytes))  # its own stdin, /proc/self/fd/0
found = first(strings)
""",
}


@pytest.mark.parametrize("mode", ["stdin", "call"])
@pytest.mark.parametrize("where", SEARCHES)
def test_expected_outputs_are_nowhere_a_program_can_look(code_gen_url, where, mode):
    row = secret_row(fn_name="solve" if mode == "call" else None)
    body = SEARCH_PRELUDE + SEARCHES[where] + "answer = f'{found or \"NOTFOUND\"} probe={probe}'\n"
    body += "def solve(*args):\n    return answer\n" if mode == "call" else "print(answer)\n"
    result = verify(code_gen_url, row, fenced(body + "# PROBE-fs"))
    got = json.loads(result["metadata"]["got"]) if mode == "call" else result["metadata"]["got"].strip()
    assert (result["reward"], result["verdict"], got) == (0.0, "wrong_answer", "NOTFOUND probe=True"), result


# ------------------------------------------------------------------------------------------------ second line

class LeakyCodeGen(CodeGenServer):
    """A grader with the hole the canaries are for: it writes each batch's expected outputs into the sandbox."""

    async def _run_cases(self, program, cases, options):
        leak = {"files": {"expected.json": json.dumps([expected for _, expected in cases])}}
        results = await self.sandbox.run_batch(program, [{"stdin": stdin} for stdin, _ in cases], "python",
                                               **options, **leak)
        return results


@pytest.fixture(scope="module")
def leaky_url(sandbox_url):
    with served(sandbox_url, LeakyCodeGen) as url:
        yield url


SLOT = {  # which case of the batch this process is
    "supervisor-frame": """
frame, slot = sys._getframe(), 0
while frame is not None:
    case, request = frame.f_locals.get("case"), frame.f_locals.get("request")
    if isinstance(request, dict) and case is not None:
        slot = next(i for i, c in enumerate(request["cases"]) if c is case)
        break
    frame = frame.f_back
""",
    "counter-file": """
try:
    slot = int(open("/workspace/.n").read())
except OSError:
    slot = 0
open("/workspace/.n", "w").write(str(slot + 1))
""",
}
READ = {  # the leaked expected outputs
    "open": "leaked = json.load(open('expected.json'))\n",
    "glob": "import glob\nleaked = json.load(open(next(path for top in ('/srv', '/tmp', '/home', '/workspace') "
            "for path in glob.glob(top + '/**/*.json', recursive=True))))\n",
}
EMIT = {  # printed as the answer, by whatever path
    "print": "print(value)\n",
    "os-write-then-exit": "os.write(1, (value + '\\n').encode())\nos._exit(0)\n",
    "patched-builtins": "import builtins\n_print = builtins.print\n"
                        "builtins.print = lambda *a, **k: _print(value)\nbuiltins.print('anything')\n",
    "atexit": "import atexit\natexit.register(lambda: sys.stdout.write(value + '\\n'))\n",
}
FORGERS = {f"{slot}/{read}/{emit}": "import json, os, sys\n" + SLOT[slot] + READ[read]
           + "value = leaked[slot]\n" + EMIT[emit] for slot, read, emit in itertools.product(SLOT, READ, EMIT)}


@pytest.mark.parametrize("name", FORGERS)
def test_forgers_that_read_leaked_expected_outputs_are_caught(leaky_url, code_gen_url, name):
    row = secret_row()
    leaky = verify(leaky_url, row, fenced(FORGERS[name]))
    assert (leaky["reward"], leaky["verdict"]) == (0.0, "tests_tampered"), leaky
    assert leaky["tests_passed"] == leaky["tests_total"] == 3  # every real test was forged: only a canary saw it
    assert "must-fail" in leaky["metadata"]["reason"]
    honest_grader = verify(code_gen_url, row, fenced(FORGERS[name]))
    assert honest_grader["reward"] == 0.0 and honest_grader["failed_test"] == 0, honest_grader


def test_a_forger_that_skips_odd_looking_expected_outputs_is_still_caught(leaky_url):
    # The must-fail canary expects another real case's output, so nothing about it looks like a canary.
    disguised = ("import json, os, sys\n" + SLOT["supervisor-frame"] + READ["open"]
                 + "value = leaked[slot]\nprint(value if value.startswith('EXP' + 'ECT-') else 'x')\n")
    for _ in range(3):
        result = verify(leaky_url, secret_row(), fenced(disguised))
        assert (result["reward"], result["verdict"]) == (0.0, "tests_tampered"), result


def test_outputs_memorised_in_order_score_zero_on_the_real_grader(code_gen_url):
    # No leak needed: the program carries the row's expected outputs in test order (a memorised dataset) and
    # answers by its place in the run (the supervisor's request says which batch and which case). Without canaries
    # it would pass every test; with them a real case moves off its slot, or a canary gets a wrong answer or none.
    for _ in range(4):
        row = secret_row(count=4)
        answers = row["verifier_metadata"]["unit_tests"]["outputs"]
        memorised = ("import os, sys\n" + SLOT["supervisor-frame"]
                     + f"ANSWERS = {answers!r}\nprint(ANSWERS[0 if len(request['cases']) == 1 else 1 + slot])\n")
        result = verify(code_gen_url, row, fenced(memorised))
        assert result["reward"] == 0.0, result


HONEST = {
    "print": "print(2 * int(input()))",
    "stdout-write": "import sys\nsys.stdout.write(str(2 * int(sys.stdin.read())) + '\\n')",
    "os-write": "import os, sys\nos.write(1, b'%d\\n' % (2 * int(sys.stdin.buffer.read())))",
    "exit-0-after": "import sys\nprint(2 * int(input()))\nsys.exit(0)",
    "random-but-right": "import random\nn = int(input())\nprint(sum(random.sample([n, n], 2)))",
}


@pytest.mark.parametrize("how", HONEST)
def test_honest_programs_are_never_flagged(code_gen_url, how):
    numbers = [random.randrange(-10**6, 10**6) for _ in range(4)]
    row = {"responses_create_params": {"input": [{"role": "user", "content": "Double it."}]},
           "verifier_metadata": {"unit_tests": {"inputs": [str(n) for n in numbers],
                                                "outputs": [str(2 * n) for n in numbers]}}}
    for _ in range(3):  # fresh canaries each time
        result = verify(code_gen_url, row, fenced(HONEST[how]))
        assert (result["reward"], result["verdict"]) == (1.0, "passed"), result
