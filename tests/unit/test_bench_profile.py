"""bench/profile.py's attribution of py-spy samples to components (no server)."""

from __future__ import annotations

from bench import profile

FLASK = "Flask.__call__ (flask/app.py:1536)"
POLICY = "review (webhook/policies/eviction.py:40)"
LOADS = "JSONDecoder.raw_decode (json/decoder.py:353)"
ANSWER = "Connection._answer (webhook/serve/front/connection.py:250)"


def test_each_sample_goes_to_the_innermost_frame_that_names_a_component():
    assert profile.component(f"Thread 1;{ANSWER};{FLASK};{POLICY}") == "policy"
    assert profile.component(f"Thread 1;{FLASK};{POLICY};{LOADS}") == "json"  # json called by a policy
    assert profile.component(f"Thread 1;{ANSWER}") == "front"
    assert profile.component("Thread 1;main (x.py:1)") == "other"


def test_shares_add_up_over_every_sample_and_skip_lines_without_a_count():
    collapsed = "\n".join([f"Thread 1;{FLASK};{POLICY} 3", f"Thread 1;{ANSWER} 1", "garbage", ""])
    found = profile.shares(collapsed)
    assert found["samples"] == 4
    assert found["shares"]["policy"] == 0.75 and found["shares"]["front"] == 0.25
    assert abs(sum(found["shares"].values()) - 1) < 1e-9
    assert profile.shares("")["samples"] == 0
