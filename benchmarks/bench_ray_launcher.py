"""Environment steps per second of distributed JAX DQN CartPole: the Ray launcher against the
local launcher (actor processes spawned by the learner), with 1, 2 and 4 actors.

Same config (configs/dqn_cartpole_jax_distributed.gin, ``--training_steps`` per iteration),
runs alternating local / ray for each actor count, ``--repeats`` rounds. The rate is the
training phase's env steps/s from episodes.csv, iterations after the first (start-up, Ray's
included, and compilation are left out), as benchmarks/bench_train_throughput.py measures it.
Ray runs join one local Ray cluster (loopback) started here, as a cluster would be running.
With ``--nodes N`` (N >= 2) that cluster is N simulated nodes on this machine
(``ray.cluster_utils.Cluster``, all on 127.0.0.1): a head without CPUs, a learner node with the
custom resource ``learner`` (the run binds ``RayConfig.learner_resources``) and N - 2 actor
nodes, so the learner and the actors run on different Ray nodes (separate raylets, object
stores and worker pools; the same CPUs and kernel, so no network between them).
``--base DIR`` keeps the runs (to ``memoire plot`` them).

    PYTHONPATH=$PWD nice -n 10 python benchmarks/bench_ray_launcher.py [--actors 1,2,4]
        [--iterations 3] [--training_steps 500] [--repeats 1] [--nodes 4] [--base DIR]
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))
from _tiny_run import train_command  # noqa: E402  the tests' command, with this benchmark's budgets
from bench_train_throughput import steps_per_second  # noqa: E402  one definition of the rate


def run(base, launcher, actors, iterations, training_steps, address, nodes=1):
    placed = ["RayConfig.learner_resources = {'learner': 1}"] if launcher == "ray" else []
    cmd = train_command(
        base,
        f"DistributedConfig.num_actors = {actors}",
        f"Runner.num_iterations = {iterations}",
        f"Runner.training_steps = {training_steps}",
        "Runner.evaluation_steps = 50",
        *(placed if nodes > 1 else []),
        tiny=False,
        launcher=launcher,
        ray_address=address if launcher == "ray" else None,
    )
    os.makedirs(base)
    with open(os.path.join(base, "out.txt"), "w") as out:
        subprocess.run(
            cmd, check=True, stdout=out, stderr=subprocess.STDOUT, timeout=1200, cwd=base
        )
    return steps_per_second(os.path.join(base, "setting_0", "run_0"))


def keep_or_temp(base):
    """``base`` (made if missing) kept after the runs, or a temporary folder."""
    if base is None:
        return tempfile.TemporaryDirectory()
    os.makedirs(base, exist_ok=True)
    return contextlib.nullcontext(os.path.abspath(base))


def start_cluster(nodes, actors):
    """A Ray cluster of ``nodes`` simulated nodes on 127.0.0.1: a head without CPUs, a learner
    node (resource ``learner``, 1 CPU) and ``nodes - 2`` actor nodes sharing ``actors`` CPUs
    (at least 1 each). Returns ``(address, cluster)``; the runs join it by address."""
    import ray
    from ray.cluster_utils import Cluster

    # Ray turns a loopback address given to ray.init into the machine's IP unless this is a
    # cluster of one machine: keep every driver (the runs' too: they inherit it) on loopback.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False  # read when Ray was imported
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no report to ray.io from the head
    loopback = dict(node_ip_address="127.0.0.1")
    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=0, include_dashboard=False, **loopback),
    )
    cluster.add_node(num_cpus=1, resources={"learner": 1}, **loopback)
    others = max(1, nodes - 2)
    for _ in range(others):
        cluster.add_node(num_cpus=max(1, -(-actors // others)), **loopback)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster.address, cluster


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--actors", default="1,2,4")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--training_steps", type=int, default=500)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--nodes", type=int, default=1, help="simulated Ray nodes (1: one)")
    p.add_argument("--base", default=None, help="keep the runs here (default: a temp dir)")
    args = p.parse_args()
    counts = [int(n) for n in args.actors.split(",")]
    import ray

    cluster = None
    if args.nodes >= 2:
        address, cluster = start_cluster(args.nodes, max(counts))
    else:
        ray.init(
            num_cpus=1 + max(counts),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
        )
        address = ray.get_runtime_context().gcs_address
    print(f"ray: {args.nodes} node(s) at {address}; load {open('/proc/loadavg').read().strip()}")
    rates = {(launcher, n): [] for n in counts for launcher in ("local", "ray")}
    try:
        with keep_or_temp(args.base) as tmp:
            for k in range(args.repeats):
                for n in counts:
                    for launcher in ("local", "ray") if k % 2 == 0 else ("ray", "local"):
                        rate = run(
                            os.path.join(tmp, f"{launcher}_{n}_{k}"),
                            launcher,
                            n,
                            args.iterations,
                            args.training_steps,
                            address,
                            args.nodes,
                        )
                        rates[(launcher, n)].append(rate)
                        print(
                            f"round {k}: {n} actor(s), {launcher:5s} {rate:8.1f} env steps/s",
                            flush=True,
                        )
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    print(f"load after: {open('/proc/loadavg').read().strip()}")
    print(
        f"{'actors':>6}  {'local':>8}  {'ray':>8}  ray/local   (env steps/s, median of "
        f"{args.repeats})"
    )
    for n in counts:
        local = statistics.median(rates[("local", n)])
        on_ray = statistics.median(rates[("ray", n)])
        print(f"{n:>6}  {local:8.1f}  {on_ray:8.1f}  {on_ray / local:9.2f}")


if __name__ == "__main__":
    main()
