"""swerl_gen repro-gen: a reproduction script cannot pass by looking at how its tree was made.

Scripts generated from {the trace they key on} x {how they leave}: on the real grader every tree is prepared the
same way, so none of them even reproduces; on a grader weakened on purpose (it leaves its folder, gold patch
included, in the tree) each reproduces on the real pair and is caught by the unfixed canary, which was patched and
reverted. Gold scripts, run again and again with fresh noise, always score 1."""

from __future__ import annotations

import itertools

import pytest

from gymfleet.testing import serve
from resources_servers.swerl_gen.app import DRIVER, SwerlGenServer
from resources_servers.swerl_gen.examples import TASKS
from resources_servers.swerl_gen.repro import comment_line, run_files
from resources_servers.swerl_gen.tests.test_swerl_gen import INTERVALS_REPRO, TEXTSTATS_REPRO, repro_answer, verify

TRACES = {  # "fixed" as the script reads it from the tree, not from the code's behaviour
    "grader-folder": "os.path.isdir('.gymfleet')",
    "gold-patch-size": "os.path.exists('.gymfleet/gold.patch') and os.path.getsize('.gymfleet/gold.patch') > 0",
    "any-patch-text": "any('diff --git' in open(p, errors='replace').read() for p in glob.glob('**/*.patch', "
                      "recursive=True) + glob.glob('.*/*.patch'))",
    "newer-than-script": "any(os.path.getmtime(p) > os.path.getmtime('reproduce_bug.py') "
                         "for p in glob.glob('**/*.py', recursive=True) if p != 'reproduce_bug.py')",
}
EXITS = {
    "sys.exit": "sys.exit(0 if fixed else 2)",
    "os._exit": "os._exit(0 if fixed else 2)",
    "raise": "raise SystemExit(0 if fixed else 2)",
    "atexit": "import atexit\natexit.register(os._exit, 0 if fixed else 2)",
}
SCRIPTS = {f"{trace}/{leave}": f"import glob, os, sys\nfixed = {TRACES[trace]}\n{EXITS[leave]}"
           for trace, leave in itertools.product(TRACES, EXITS)}


WEAK_GRADER_LEAKS = {"gold-patch-size", "any-patch-text"}  # the traces that tell its fixed trees apart


class LeavesItsFolder(SwerlGenServer):
    """The hole the canaries are for: the grader's folder (and the gold patch in it) stays in the tree."""

    driver = DRIVER.replace("    rm -rf .gymfleet ;;", "    ;;")


@pytest.fixture(scope="module")
def urls(sandbox_url):
    config = {"name": "swerl_gen", "domain": "coding", "sandbox_url": sandbox_url, "test_timeout_s": 2,
              "memory_mb": 512}
    with serve(SwerlGenServer(config).create_app()) as real, serve(LeavesItsFolder(config).create_app()) as weak:
        yield real, weak


def test_noise_is_fresh_and_in_each_files_comment_syntax():
    assert comment_line("a/b.py").startswith("# ") and comment_line("x.c").startswith("// ")
    assert comment_line("q.sql").startswith("-- ") and comment_line("README") == ""
    assert len({comment_line("a.py") for _ in range(20)}) == 20
    gold = TEXTSTATS_REPRO["instance"]["patch"]
    trees = [run_files("x", gold, tree) for tree in ("unfixed", "fixed", "reverted")]
    assert [tree[".gymfleet/gold.patch"] == gold for tree in trees] == [False, True, True]
    assert [".gymfleet/revert" in tree for tree in trees] == [False, False, True]
    assert all(line.split("\t")[0] == "textstats/counting.py" for line in trees[0][".gymfleet/noise"].splitlines())


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_keyed_on_how_the_tree_was_made_score_zero(urls, name):
    real, weak = urls
    result = verify(real, TEXTSTATS_REPRO, repro_answer(SCRIPTS[name]))
    assert (result["reward"], result["reason"]) == (0.0, "not_reproduced"), result
    caught = verify(weak, TEXTSTATS_REPRO, repro_answer(SCRIPTS[name]))
    if name.split("/")[0] in WEAK_GRADER_LEAKS:  # the real pair reproduces: only the canary sees the forgery
        assert (caught["return_codes_before_patch"], caught["return_codes_after_patch"]) == ([2], [0]), caught
        assert (caught["reward"], caught["reason"]) == (0.0, "tests_tampered"), caught
        assert "unfixed canary" in caught["detail"]
    else:  # a trace the weakened grader leaves in every tree alike (its folder; fresh file times)
        assert (caught["reward"], caught["reason"]) == (0.0, "not_reproduced"), caught


def test_gold_scripts_always_score_one(urls):
    real, _ = urls
    for _ in range(3):
        for row, task in ((TEXTSTATS_REPRO, TASKS[0]), (INTERVALS_REPRO, TASKS[1])):
            result = verify(real, row, repro_answer(task.repro))
            assert (result["reward"], result["reason"]) == (1.0, None), result
