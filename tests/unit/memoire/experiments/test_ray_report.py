"""memoire.experiments.ray_report without a Ray cluster: the lines the Ray launcher says about
its actors (placed, lost, restarted, gone) from a scripted actor table, the count in the
learner's closing line, and what it says of a process no node can hold."""

import types

import pytest

from memoire.experiments import ray_report

NODES = [
    {"id": "aaaa1111" + "0" * 48, "ip": "10.0.0.1", "total": {"CPU": 1.0}, "free": {"CPU": 0.0}},
    {"id": "bbbb2222" + "0" * 48, "ip": "10.0.0.2", "total": {"CPU": 2.0}, "free": {"CPU": 0.0}},
]


def _row(state, pid=0, node="", restarts=0, reason=None):
    cause = None
    if reason is not None:
        from ray.core.generated import common_pb2

        cause = common_pb2.ActorDeathCause()
        cause.actor_died_error_context.reason = common_pb2.ActorDiedErrorContext.Reason.Value(
            reason
        )
    return {
        "State": state,
        "Pid": pid,
        "Address": {"NodeID": node},
        "NumRestarts": restarts,
        "DeathCause": cause,
    }


def test_the_watch_says_each_change_once_and_counts_them():
    pytest.importorskip("ray")
    handles = [types.SimpleNamespace(_actor_id=bytes([k]) * 16) for k in range(3)]
    a, b = NODES[0]["id"], NODES[1]["id"]
    script = [
        # 0 and 1 placed, 2 waits for room
        {0: _row("ALIVE", 10, a), 1: _row("ALIVE", 11, b), 2: _row("PENDING_CREATION")},
        # 1's node is lost: Ray restarts it; 2 is placed
        {
            0: _row("ALIVE", 10, a),
            1: _row("RESTARTING", 0, b, 1, "NODE_DIED"),
            2: _row("ALIVE", 12, b),
        },
        {0: _row("ALIVE", 10, a), 1: _row("ALIVE", 13, a, 1), 2: _row("ALIVE", 12, b)},
        # 0 is killed for good
        {
            0: _row("DEAD", 0, a, 3, "WORKER_DIED"),
            1: _row("ALIVE", 13, a, 1),
            2: _row("ALIVE", 12, b),
        },
    ]
    step = {"now": 0}

    def table(actor_id):
        return script[step["now"]][bytes.fromhex(actor_id)[0]]

    watch = ray_report.ActorWatch(handles, 3, table=table, nodes=lambda: NODES)
    assert watch.poll(say=False) == []  # the first look: the launcher reports it as a whole
    assert sorted(watch.placed) == [0, 1] and watch.pending() == [2]
    said = []
    for step["now"] in range(1, len(script)):
        said.append(watch.poll(say=False))
    assert said == [
        [
            "ray: actor 1 lost (its node was lost); Ray restarts it (restart 1 of 3)",
            "ray: actor 2 placed on 10.0.0.2 (bbbb2222) (3 of 3 placed)",
        ],
        ["ray: actor 1 restarted on 10.0.0.1 (aaaa1111)"],
        ["ray: actor 0 is gone for good (its process died)"],
    ]
    assert watch.report() == "Ray actors: 3 of 3 placed, 2 lost, 1 restarted"
    assert watch.poll(say=False) == []  # nothing new: nothing said


def test_a_process_no_node_can_hold_is_named_with_its_resource():
    assert ray_report.never_placed({"CPU": 1.0}, NODES) is None
    assert ray_report.never_placed({"CPU": 1.0, "learner": 1.0}, NODES) == (
        "no node of the cluster has 'learner'"
    )
    assert ray_report.never_placed({"CPU": 4.0}, NODES) == (
        "no node has that much (the most one node has: 2 CPU)"
    )
    assert ray_report.demand(1, 0, {"learner": 1}) == {"CPU": 1.0, "learner": 1.0}
    assert ray_report.resources_text({"CPU": 1.0, "learner": 1.0, "GPU": 0.0}) == "1 CPU, 1 learner"
    assert ray_report.free_text({"CPU": 1.0}, NODES) == "0 CPU free of 3"


def test_rays_own_lines_are_told_from_a_programs():
    assert ray_report.is_ray_line(
        "[2026-11-28 23:26:36,341 W 17028 17028] gcs_client.cc:210: Failed to get cluster ID"
    )
    assert ray_report.is_ray_line("2026-11-28 23:24:15,263\tINFO worker.py:1841 -- Connecting")
    assert not ray_report.is_ray_line("[2026-11-28 23:26:36,341 E 1 1] raylet.cc:1: broken")
    assert not ray_report.is_ray_line("INFO memoire.experiments.runner: iteration 1/1: ...")
