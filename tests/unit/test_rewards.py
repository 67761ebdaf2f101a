"""Rewards by name with YAML options, extra columns as keyword arguments, batched and async rewards, time-outs, and a
remote reward service over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlfleet.plugins import PluginError
from rlfleet.protocols import Prompt
from rlfleet.rewards.scorer import RewardFailure, Scorer, batched, load_scorer, resolve_reward


def P(label: str | None = None, **extras) -> Prompt:
    return Prompt(index=0, text="q", label=label, extras=extras)


def score(name: str, completion: str, label: str | None, **args) -> float:
    return load_scorer(name, args, 10.0).score(P(label), completion, None)[0]


def test_exact_match_and_last_number() -> None:
    assert score("exact_match", " 42\n", "42") == 1.0
    assert score("exact_match", "Forty", "forty") == 0.0
    assert score("exact_match", "Forty", "forty", case_sensitive=False) == 1.0
    assert score("last_number", "3 + 4 = 7, so the answer is 1,250.", "1250") == 1.0
    assert score("last_number", "first 12 then 13", "12") == 0.0
    assert score("last_number", "no digits here", "5") == 0.0
    assert score("last_number", "about 3.14", "3.1416", tolerance=0.01) == 1.0
    assert score("last_number", "about 3.14", "3.1416") == 0.0
    assert score("last_number", "-7", "-7.0") == 1.0
    assert score("last_number", "1010", "1000", tolerance=0.02, relative=True) == 1.0


def test_regex_format_combined_math() -> None:
    assert score("regex", "blah ANSWER: 17 ok", "17", pattern=r"answer:\s*(\d+)", ignore_case=True) == 1.0
    assert score("regex", "blah answer: 18", "17", pattern=r"answer:\s*(\d+)") == 0.0
    assert score("regex", "done.", None, pattern=r"done\.$") == 1.0
    assert score("format", "<think>add them</think> 12", None) == 1.0
    assert score("format", "12 <think>late</think>", None) == 0.0
    assert score("format", "<think>no answer</think>  ", None) == 0.0
    both = load_scorer("combined", {"format": {"weight": 0.5}, "last_number": {}}, 10.0)
    assert both.score(P("12"), "<think>7+5</think> 12", None) == (1.5, {"format": 0.5, "last_number": 1.0})
    assert both.score(P("12"), "13", None) == (0.0, {"format": 0.0, "last_number": 0.0})
    assert score("math", r"so the answer is $\frac{1}{2}$", "0.5") == 1.0
    assert score("math", r"the answer is $\boxed{3}$", "4") == 0.0


def test_unknown_names_and_bad_options_are_refused() -> None:
    with pytest.raises(PluginError, match=r"reward_fn 'last_numbr': unknown reward \(stock rewards: .*last_number"):
        resolve_reward("last_numbr", {})
    with pytest.raises(PluginError, match=r"'last_number': options \['tolerence'\] do not fit"):
        resolve_reward("last_number", {"tolerence": 1})
    with pytest.raises(PluginError, match="regex.*bad options"):
        resolve_reward("regex", {"pattern": "("})
    with pytest.raises(RewardFailure, match="reward 'exact_match' needs a label: set label_field"):
        load_scorer("exact_match", {}, 5.0).score(P(None), "x", None)


def level_reward(prompt: Prompt, completion: str, sample: object, level: int, unused: str = "d") -> float:
    return float(level) + (0.5 if unused == "d" else 0.0)


def kwargs_reward(prompt: Prompt, completion: str, sample: object, **kw: object) -> float:
    return float(len(kw)) + (10.0 if kw.get("topic") == "math" else 0.0)


def test_extra_columns_arrive_as_keyword_arguments() -> None:
    prompt = P("1", level=3, topic="math")
    assert Scorer(level_reward, 5.0).score(prompt, "x", None) == (3.5, {})       # only the columns it names
    assert Scorer(kwargs_reward, 5.0).score(prompt, "x", None) == (12.0, {})     # **kwargs: all of them


@batched
def batch_reward(prompts: list[Prompt], completions: list[str], samples: list[object], level: list[int]) -> list:
    return [float(len(c)) + lv for c, lv in zip(completions, level, strict=True)]


async def async_reward(prompt: Prompt, completion: str, sample: object) -> float:
    await asyncio.sleep(0.01)
    return 2.0 if completion == "ok" else 0.0


def test_batched_and_async() -> None:
    s = Scorer(batch_reward, 5.0)
    assert s.batched
    out = s.score_batch([P(level=1), P(level=2)], ["ab", "abc"], [None, None])
    assert out == [(3.0, {}), (5.0, {})]
    a = Scorer(async_reward, 5.0)
    assert a.is_async and a.score(P(), "ok", None) == (2.0, {}) and a.score(P(), "no", None) == (0.0, {})


def hanging_reward(prompt: Prompt, completion: str, sample: object) -> float:
    time.sleep(30)
    return 1.0


async def hanging_async(prompt: Prompt, completion: str, sample: object) -> float:
    await asyncio.sleep(30)
    return 1.0


def raising_reward(prompt: Prompt, completion: str, sample: object) -> float:
    raise KeyError("no such test case")


def test_hanging_raising_and_non_finite_rewards_fail_with_the_reason() -> None:
    for fn in (hanging_reward, hanging_async):
        t0 = time.monotonic()
        with pytest.raises(RewardFailure, match=r"reward_fn timed out after 0.3s"):
            Scorer(fn, 0.3).score(P(), "x", None)
        assert time.monotonic() - t0 < 3.0
    with pytest.raises(RewardFailure, match=r"reward_fn raised KeyError: 'no such test case'"):
        Scorer(raising_reward, 1.0).score(P(), "x", None)
    with pytest.raises(RewardFailure, match="not finite"):
        Scorer(lambda p, c, s: float("nan"), 1.0).score(P(), "x", None)
    mixed = Scorer(batched(lambda ps, cs, ss: [1.0, "bad"]), 1.0).score_batch([P(), P()], ["a", "b"], [None, None])
    assert mixed[0] == (1.0, {}) and isinstance(mixed[1], RewardFailure)


def test_a_hung_reward_keeps_its_thread_and_the_next_calls_reuse_one() -> None:
    import threading

    gate = threading.Event()

    def sometimes_hangs(prompt: Prompt, completion: str, sample: object) -> float:
        if completion == "hang":
            gate.wait(30)
        return float(len(completion))

    scorer = Scorer(sometimes_hangs, 0.3)
    assert scorer.score(P(), "ab", None) == (2.0, {})
    with pytest.raises(RewardFailure, match="timed out"):
        scorer.score(P(), "hang", None)
    before = sum(t.name == "reward" for t in threading.enumerate())
    assert [scorer.score(P(), "x" * i, None)[0] for i in range(50)] == [float(i) for i in range(50)]
    assert sum(t.name == "reward" for t in threading.enumerate()) == before + 1    # one more, reused 50 times
    assert all(t.daemon for t in threading.enumerate() if t.name == "reward")
    gate.set()


def test_a_groups_samples_score_in_one_job_each_with_its_own_time_out() -> None:
    """score_batch of a plain reward: the samples run one after another on one pool thread (one hand-off), each with
    the time-out to itself; one that raises or hangs fails alone, the ones after a hang run on another thread and
    are called once each (the abandoned job starts no further call), and the results keep the samples' order."""
    gate = threading.Event()
    calls: list[str] = []

    def reward(prompt: Prompt, completion: str, sample: object) -> float:
        calls.append(completion)
        if completion == "hang":
            gate.wait(30)
        if completion == "raise":
            raise ValueError("bad case")
        if completion == "nan":
            return float("nan")
        time.sleep(0.1)                   # each call alone fits the time-out; all of them together do not
        return float(len(completion))

    scorer = Scorer(reward, 0.3)
    jobs: list[object] = []                                     # what the scorer hands to its reward threads
    hand = scorer._pool.run

    def counted(job: Callable[[], None]) -> None:
        jobs.append(job)
        hand(job)

    scorer._pool.run = counted                                  # type: ignore[method-assign]
    quick = scorer.score_batch([P()] * 4, ["a", "bb", "ccc", "dddd"], [None] * 4)
    assert quick == [(1.0, {}), (2.0, {}), (3.0, {}), (4.0, {})]
    assert len(jobs) == 1                                       # the four went to a reward thread as one job
    calls.clear()
    t0 = time.monotonic()
    out = scorer.score_batch([P()] * 6, ["a", "raise", "hang", "nan", "bb", "ccc"], [None] * 6)
    assert time.monotonic() - t0 < 3.0
    assert out[0] == (1.0, {}) and out[4] == (2.0, {}) and out[5] == (3.0, {})
    assert isinstance(out[1], RewardFailure) and "raised ValueError: bad case" in str(out[1])
    assert isinstance(out[2], RewardFailure) and "timed out after 0.3s" in str(out[2])
    assert isinstance(out[3], RewardFailure) and "not finite" in str(out[3])
    assert len(jobs) == 3                                       # one job, and one more for the calls after the hang
    gate.set()                                                  # the hung call returns: its job starts nothing more
    time.sleep(0.3)
    assert calls == ["a", "raise", "hang", "nan", "bb", "ccc"]


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append({**body, "auth": self.headers.get("Authorization")})
        if body["completion"] == "slow":
            time.sleep(2.0)
        if body["completion"] == "crash":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"sandbox crashed")
            return
        reply = {"parts": {"passed": 1.0 if body["completion"] == body["label"] else 0.0, "style": 0.25}}
        data = json.dumps(reply).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except BrokenPipeError:
            pass                            # the client gave up (the time-out case)

    def log_message(self, *args: object) -> None:
        pass


def test_groups_scored_together_run_their_jobs_at_the_same_time() -> None:
    """score_batches starts every group's job before it waits for any: a reward that blocks until three groups'
    calls are in progress at once (a barrier of 3) scores them all. Run one group after another it would break the
    barrier (BrokenBarrierError after 10 s) and fail them. Sync, batched and async rewards alike."""

    def make(kind: str):
        barrier = threading.Barrier(3, timeout=10)
        seen: list[str] = []

        def plain(prompt: Prompt, completion: str, sample: object) -> float:
            if completion.endswith("0"):
                barrier.wait()                      # the first call of each group's job
            seen.append(completion)
            return float(len(completion))

        @batched
        def whole(prompts: list, completions: list, samples: list) -> list[float]:
            barrier.wait()
            seen.extend(completions)
            return [float(len(c)) for c in completions]

        async def coro(prompt: Prompt, completion: str, sample: object) -> float:
            if completion.endswith("0"):
                await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
            seen.append(completion)
            return float(len(completion))

        return {"sync": plain, "batched": whole, "async": coro}[kind], seen

    for kind in ("sync", "batched", "async"):
        fn, seen = make(kind)
        groups = [([P()] * 2, [f"g{g}-0", f"g{g}-10"], [None, None]) for g in range(3)]
        results = Scorer(fn, 30.0).score_batches(groups)
        assert results == [[(4.0, {}), (5.0, {})]] * 3, kind
        assert sorted(seen) == sorted(c for _, cs, _ in groups for c in cs), kind


def test_remote_reward_service_over_http(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "tok"
    token.write_text("s3cret\n")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/score"
        s = load_scorer("remote", {"url": url, "timeout": 0.5, "token_file": str(token)}, 10.0)
        assert s.score(P("7", lang="py"), "7", None) == (1.25, {"passed": 1.0, "style": 0.25})
        seen = _Handler.seen[-1]
        assert seen["label"] == "7" and seen["extras"] == {"lang": "py"} and seen["auth"] == "Bearer s3cret"
        with pytest.raises(RewardFailure, match="did not answer"):
            s.score(P("7"), "slow", None)
        with pytest.raises(RewardFailure, match="HTTP 500"):
            s.score(P("7"), "crash", None)
    finally:
        server.shutdown()
    with pytest.raises(PluginError, match="must start with http"):
        resolve_reward("remote", {"url": "ftp://x"})
