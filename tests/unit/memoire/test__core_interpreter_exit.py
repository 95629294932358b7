"""A program that ends while memoire's threads wait in native code exits as it meant to.

At interpreter exit CPython ends a daemon thread that asks for the GIL back; through a binding
whose GIL release could not unwind that was std::terminate ("terminate called without an active
exception", exit 134), seen when a server process ended without ``close()``. Each case runs in
its own interpreter, whose exit status and stderr are checked.
"""

from _subprocess_env import assert_clean_exit, run_script


def test_daemon_threads_in_native_waits_do_not_abort_the_exit(tmp_path):
    # Waits of 2 ms in a loop: the threads come back for the GIL while the interpreter ends.
    proc = run_script(
        """
        import threading
        import numpy as np
        from memoire import ReplayMemory
        from memoire.bench.ingest import templates
        from memoire.rate_limiter import MinSize

        limiter = MinSize(10)  # nothing is inserted: every sample waits out its timeout
        memory = ReplayMemory(*templates((4,), np.float32), 1000)

        def wait():
            while True:
                limiter.await_sample(1, 0.002, False)  # False: no TimeoutError

        def sample():
            while True:
                try:
                    memory.get_batch(8)
                except Exception:
                    pass

        for target in (wait, wait, sample):
            threading.Thread(target=target, daemon=True).start()
        print("OK", flush=True)
        """,
        tmp_path,
    )
    assert_clean_exit(proc)


def test_a_server_left_open_with_a_stream_closes_at_exit(tmp_path):
    # No close(): the server's stream worker, its native samplers and the learner's stream are
    # all running when the program ends.
    proc = run_script(
        """
        import numpy as np
        from memoire import ReplayMemoryServer
        from memoire.stream import SamplingStream

        from memoire.bench.ingest import episode_rows, templates

        server = ReplayMemoryServer(*templates((8, 8), np.uint8), 2000, pub_endpoint=None)
        server.rem.new_episode()
        server.rem.add_entries(*episode_rows((8, 8), np.uint8, 300))
        server.rem.close_episode()
        server.start()
        endpoint = server.start_stream("tcp://127.0.0.1:*", threads=2)
        stream = SamplingStream(endpoint, 16, credit=8, timeout=30)
        held = [next(stream) for _ in range(4)]
        print("OK", flush=True)
        """,
        tmp_path,
    )
    assert_clean_exit(proc)
