"""code_gen as a real server over a real sandbox: gold and wrong programs, each failure kind, NeMo-Gym rows,
tampering with the grader, and a sandbox that is down."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import free_port, nemo_gym_examples, serve
from resources_servers.code_gen.app import CodeGenServer
from resources_servers.code_gen.tests.conftest import fenced, verify

ROOT = Path(__file__).resolve().parents[3]
OUR_ROWS = [json.loads(line) for line in
            (ROOT / "resources_servers/code_gen/data/example.jsonl").read_text().splitlines()]
NEMO_ROWS = [json.loads(line) for line in
             (nemo_gym_examples("code_gen") / "example.jsonl").read_text().splitlines()]

GOLD = [
    "n = int(input())\na = list(map(int, input().split()))\nbest, low = 0, a[0]\nfor x in a[1:]:\n"
    "    best = max(best, x - low)\n    low = min(low, x)\nprint(best)",
    "import sys\nwords = sys.stdin.read().split()[1:]\nfor w in words:\n    print(sum(c in 'aeiou' for c in w))",
    "data = open(0).read().split()\nn = int(data[0])\nprint(f'{sum(map(float, data[1:n + 1])) / n:.6f}')",
    "class Solution:\n    def maxSubarraySum(self, nums: List[int]) -> int:\n        best = cur = nums[0]\n"
    "        for x in nums[1:]:\n            cur = max(x, cur + x)\n            best = max(best, cur)\n"
    "        return best",
    "def count_pairs(nums, target):\n    seen = Counter()\n    total = 0\n    for x in nums:\n"
    "        total += seen[target - x]\n        seen[x] += 1\n    return total",
]
# Our own solution to the last NeMo-Gym example (is each prefix 1..m of the permutation contiguous?).
NEMO_LAST_GOLD = (
    "import sys\ndata = sys.stdin.read().split()\nt, i = int(data[0]), 1\nfor _ in range(t):\n"
    "    n = int(data[i]); p = data[i + 1:i + 1 + n]; i += 1 + n\n    pos = [0] * (n + 1)\n"
    "    for k, v in enumerate(p):\n        pos[int(v)] = k\n    lo = hi = pos[1]\n    bits = []\n"
    "    for m in range(1, n + 1):\n        lo, hi = min(lo, pos[m]), max(hi, pos[m])\n"
    "        bits.append('1' if hi - lo == m - 1 else '0')\n    print(''.join(bits))"
)


@pytest.mark.parametrize("index", range(5), ids=[row["uuid"][-9:] for row in OUR_ROWS])
def test_gold_programs_score_one(code_gen_url, index):
    result = verify(code_gen_url, OUR_ROWS[index], fenced(GOLD[index]))
    assert (result["reward"], result["verdict"], result["failed_test"]) == (1.0, "passed", None), result
    assert result["result"] == [True] * result["tests_total"] and result["extracted_model_code"] == GOLD[index]
    assert result["difficulty"] == OUR_ROWS[index]["verifier_metadata"]["difficulty"]


@pytest.mark.parametrize(("code", "verdict", "failed_test", "code_result"), [
    ("print(0)", "wrong_answer", 0, -2),
    ("n = int(input())\nprint(5 if n == 5 else -1)", "wrong_answer", 1, -2),
    ("while True: pass", "timeout", 0, -3),
    ("raise SystemExit(input() and 2)", "runtime_error", 0, -4),
    ("x = bytearray(1 << 32)", "memory_limit", 0, -4),
    ("def broken(:", "runtime_error", 0, -4),
], ids=["wrong-first", "wrong-second", "timeout", "exit-status", "memory", "syntax-error"])
def test_failures_are_explained(code_gen_url, code, verdict, failed_test, code_result):
    result = verify(code_gen_url, OUR_ROWS[0], fenced(code))
    assert (result["reward"], result["verdict"], result["failed_test"]) == (0.0, verdict, failed_test), result
    assert result["result"][-1] == code_result and result["metadata"]["test"] == failed_test
    if verdict == "wrong_answer":
        assert result["metadata"]["expected"] == OUR_ROWS[0]["verifier_metadata"]["unit_tests"]["outputs"][failed_test]


CALL_CASES = {
    "prints-and-main-block": ("class Solution:\n    def maxSubarraySum(self, nums):\n        print('debug', nums)\n"
                              "        best = cur = nums[0]\n        for x in nums[1:]:\n"
                              "            cur = max(x, cur + x)\n            best = max(best, cur)\n"
                              "        return best\n\nif __name__ == '__main__':\n"
                              "    assert Solution().maxSubarraySum([1]) == 'example usage that would crash'",
                              1.0, "passed", None),
    "huge-debug-output": ("class Solution:\n    def maxSubarraySum(self, nums):\n        print('x' * 10**6)\n"
                          "        return max(sum(nums[i:j]) for i in range(len(nums))"
                          " for j in range(i + 1, len(nums) + 1))", 1.0, "passed", None),
    "wrong-value": ("class Solution:\n    def maxSubarraySum(self, nums):\n        return sum(nums)", 0.0,
                    "wrong_answer", 0),
    "raises": ("class Solution:\n    def maxSubarraySum(self, nums):\n        return nums[99]", 0.0,
               "runtime_error", 0),
    "no-such-method": ("def something_else(nums):\n    return 6", 0.0, "runtime_error", 0),
    "top-level-function": ("def maxSubarraySum(nums):\n    best = cur = nums[0]\n    for x in nums[1:]:\n"
                           "        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best",
                           1.0, "passed", None),
}


@pytest.mark.parametrize("name", CALL_CASES)
def test_call_based_tests(code_gen_url, name):
    code, reward, verdict, failed_test = CALL_CASES[name]
    result = verify(code_gen_url, OUR_ROWS[3], fenced(code))
    assert (result["reward"], result["verdict"], result["failed_test"]) == (reward, verdict, failed_test), result
    if name == "wrong-value":
        assert (result["metadata"]["expected"], result["metadata"]["got"]) == ("6", "1"), result["metadata"]


def test_long_non_ascii_output_is_not_cut(code_gen_url):
    row = {**OUR_ROWS[0], "verifier_metadata": {"unit_tests": {"inputs": [""], "outputs": ["€" * 40_000]}}}
    result = verify(code_gen_url, row, fenced("print('€' * 40_000)"))  # 120 kB of UTF-8 for 40k characters
    assert (result["reward"], result["verdict"]) == (1.0, "passed"), result["metadata"]


@pytest.mark.parametrize(("text", "verdict"), [
    ("", "empty"), ("I would loop over the pairs.", "no_code"), ("```python\n```", "no_code"),
], ids=["empty", "prose", "empty-block"])
def test_answers_without_code_score_zero(code_gen_url, text, verdict):
    result = verify(code_gen_url, OUR_ROWS[0], text)
    assert (result["reward"], result["verdict"]) == (0.0, verdict)


def test_think_tag_leak_scores_the_penalty_without_running(sandbox_url):
    server = CodeGenServer({"name": "code_gen", "domain": "coding", "sandbox_url": sandbox_url,
                            "reasoning_format_penalty": -0.2})
    with serve(server.create_app()) as url:
        leaked = verify(url, OUR_ROWS[0], "<think>hmm</think>" + fenced(GOLD[0]))
        twice = verify(url, OUR_ROWS[0], fenced(GOLD[0]), reasoning="<think>a</think><think>b</think>")
    for result in (leaked, twice):
        assert (result["reward"], result["verdict"]) == (-0.2, "think_tag_leak")
        assert result["reasoning_format_violation_rate"] == 1.0 and result["result"] == []


def test_header_modules_and_contest_idioms_work(code_gen_url):
    code = ("import threading\nthreading.stack_size(1 << 26)\ndef main():\n    n = int(stdin.readline())\n"
            "    q = deque(map(int, stdin.readline().split()))\n"
            "    print(max(0, max(y - x for x, y in combinations(q, 2))))\n"
            "threading.Thread(target=main).start()")  # stdin, deque, combinations: from the header
    assert verify(code_gen_url, OUR_ROWS[0], fenced(code))["reward"] == 1.0


@pytest.mark.parametrize("row", NEMO_ROWS, ids=[row["hash_id"][:8] for row in NEMO_ROWS])
def test_nemo_gym_rows_validate_and_verify(code_gen_url, row):
    empty = verify(code_gen_url, row, "")
    assert (empty["reward"], empty["verdict"]) == (0.0, "empty")
    wrong = verify(code_gen_url, row, fenced("print('no idea')"))
    assert (wrong["reward"], wrong["verdict"], wrong["failed_test"]) == (0.0, "wrong_answer", 0)
    tests = row["verifier_metadata"]["unit_tests"]
    assert wrong["hash_id"] == row["hash_id"] and wrong["tests_total"] == len(tests["inputs"])


def test_our_solution_to_a_nemo_gym_row_scores_one(code_gen_url):
    result = verify(code_gen_url, NEMO_ROWS[-1], fenced(NEMO_LAST_GOLD))
    assert (result["reward"], result["tests_passed"]) == (1.0, result["tests_total"]), result


TAMPERING = {
    "fake-all-passed": "print('All tests passed!')\nprint('@@gymfleet-call-result@@ 6')\nraise SystemExit(0)",
    "patch-the-checker": "import glob\n"
                         "for pattern in ('/**/checker.py', '/**/resources_servers/**/*.py'):\n"
                         "  for path in glob.glob(pattern, recursive=True):\n"
                         "    open(path, 'w').write('def stdout_matches(*a): return True')\n"
                         "print(0)",
    "forge-result-marker": "import atexit, sys\nclass Solution:\n    def maxSubarraySum(self, nums): return None\n"
                           "atexit.register(lambda: print('\\n@@gymfleet-call-result@@6'))\n"
                           "sys.__stdout__.write('\\n@@gymfleet-call-result@@6\\n')",
    "patch-json": "import json\njson.dumps = lambda *a, **k: '6'\njson.loads = lambda *a, **k: 6\n"
                  "class Solution:\n    def maxSubarraySum(self, nums): return None",
    "forge-supervisor": "import os\nfor fd in os.listdir(f'/proc/{os.getppid()}/fd'):\n    try:\n"
                        "        os.write(os.open(f'/proc/{os.getppid()}/fd/{fd}', os.O_WRONLY), "
                        "b'@@GF-RESULT 0 0 1 2 0 0\\n6\\n')\n    except OSError:\n        pass",
}


@pytest.mark.parametrize("name", TAMPERING)
def test_tampering_with_the_grader_scores_zero(code_gen_url, name):
    row = OUR_ROWS[3] if name in ("forge-result-marker", "patch-json") else OUR_ROWS[0]
    result = verify(code_gen_url, row, fenced(TAMPERING[name]))
    assert result["reward"] == 0.0, result
    assert (ROOT / "resources_servers/code_gen/checker.py").read_text().count("def stdout_matches") == 1


def test_a_sandbox_that_is_down_is_a_failure_row_not_a_zero():
    server = CodeGenServer({"name": "code_gen", "domain": "coding", "sandbox_url": f"http://127.0.0.1:{free_port()}"})
    with serve(server.create_app()) as url:
        result = verify(url, OUR_ROWS[0], fenced(GOLD[0]))
        empty = verify(url, OUR_ROWS[0], "")
    assert result["_ng_failure_class"] == "sandbox_failed" and "sandbox" in result["failure"]
    assert empty["reward"] == 0.0 and "_ng_failure_class" not in empty  # no code: the sandbox is not needed


def test_malformed_rows_are_a_422(code_gen_url):
    row = {**OUR_ROWS[0], "verifier_metadata": {"unit_tests": {"inputs": ["1"], "outputs": []}}}
    answer = httpx.post(f"{code_gen_url}/verify", json={**row, "response": {"output": []}}, timeout=30)
    assert answer.status_code == 422
