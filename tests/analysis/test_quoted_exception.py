"""Rule 5's last resort: a text whose only sign of failure is an exception quoted inside a sentence
('I got "AssertionError: ..."') names that exception, at low confidence, instead of "no failure
found"; anything the log itself says comes first. Exception lines follow Python's
traceback.format_exception_only ("<qualified type>: <message>"); the sentences are made up."""

from __future__ import annotations

import pytest

from tests.offline.scoring import first_failure_of


def test_an_exception_quoted_in_a_sentence_is_the_failure_when_nothing_else_is():
    ff = first_failure_of('# Error while starting the pipeline\n\nwhen I start the example I got "AssertionError: the cluster '
               'has 1 node but the config asks for 2", however num_nodes is 1 in my yaml\n')
    # "the config asks for": the words of a configuration (99-fallback's category rules)
    assert (ff["signature"], ff["confidence"], ff["category"]) == ("text.exception_quoted", "low", "config")
    assert "quotes this exception" in ff["evidence"][0]["linked_by"]


def test_a_quoted_exception_takes_its_category_from_its_words():
    ff = first_failure_of("it dies at start with ValueError: the tensor parallel size must be divisible by the head count\n")
    assert (ff["signature"], ff["category"]) == ("text.exception_quoted", "config")
    ff = first_failure_of("it dies in the loader with KeyError: 'input_ids' on every rank\n")
    assert (ff["signature"], ff["category"]) == ("text.exception_quoted", "user-code")


def test_the_last_quoted_exception_is_the_one_that_ended_the_job():
    ff = first_failure_of("first I saw KeyError: 'labels' which I fixed,\nnow it ends with IndexError: list index out of range "
               "in the collator\n")
    assert ff["summary"].startswith("The text quotes IndexError")


@pytest.mark.parametrize("text, signature", [
    # a real exception line of the log comes first
    ("I first got KeyError: 'labels' but now:\n[rank1]: RuntimeError: Expected all tensors to be on the same device\n",
     "python.exception"),
    # torchrun's failure table: a worker's exit says more than a sentence
    ("it fails with KeyError: 'labels' sometimes\n"
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n============\ntrain.py FAILED\n------------\n"
     "Failures:\n  <NO_OTHER_FAILURES>\n------------\nRoot Cause (first observed failure):\n[0]:\n"
     "  time      : 2026-03-05_07:01:51\n  host      : node-a\n  rank      : 0 (local_rank: 0)\n"
     "  exitcode  : 1 (pid: 500)\n  error_file: <N/A>\n", "torchelastic.worker_failed"),
    # a heading that names a class of failure in words
    ("# CUDA out of memory with 8 GPUs\nthe log then shows KeyError: 'labels' once\n", "text.failure_mention"),
    # a traceback's own exception line: Python 3.11's exception group prints its members' lines behind "| "
    ("  + Exception Group Traceback (most recent call last):\n  |   File \"/w/run.py\", line 16, in <module>\n"
     "  |     asyncio.run(main())\n  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)\n"
     "  +-+---------------- 1 ----------------\n    | Traceback (most recent call last):\n"
     "    |   File \"/w/run.py\", line 6, in worker\n    |     raise ConnectionError(\"peer gone\")\n"
     "    | ConnectionError: peer gone\n    +------------------------------------\n", "python.exception"),
])
def test_what_the_log_or_a_heading_says_comes_before_a_quoted_exception(text, signature):
    ff = first_failure_of(text)
    assert ff["signature"] == signature


@pytest.mark.parametrize("text", [
    "    except ValueError: pass\n",  # a handler in source, no exception raised
    "we saw NaN once last week, unrelated\nall good now\n",
    "UserWarning: TypedStorage is deprecated\n",
])
def test_no_quoted_exception_no_failure(text):
    assert first_failure_of(text) is None
