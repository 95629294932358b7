"""A crafted JAX-face checkpoint whose sampler keys lie anywhere in int64 (issue 45).

`ReplayBuffer.load` -> `from_state_dict` -> `TransitionStore.import_state` checks only how many
sampler keys there are; the store checks each key. A key near INT64_MIN once overflowed
`key - (add_count - m)` before its range was checked (undefined behaviour: an
UndefinedBehaviorSanitizer build stops there; a normal build wrapped and refused it without
saying why). The load is refused with a ProtocolError that names the key and the stored range,
the buffer is unchanged and still adds and samples. The body runs in its own interpreter, so a
sanitizer's abort there fails the test instead of ending pytest.
"""

import subprocess
import sys
import textwrap

import pytest
from _subprocess_env import HELPERS, subprocess_env

BODY = """
import glob, os
import msgpack
import numpy as np
import pytest
from memoire import ProtocolError
from memoire.dopamine_compat import jax_replay_buffer as jrb
from memoire.dopamine_compat.checkpoint import CheckpointError

INT64_MIN = -(2**63)

def make(seed):
    acc = jrb.TransitionAccumulator(2, 1, 0.9)
    sampler = (jrb.PrioritizedSamplingDistribution(seed, max_capacity=12) if PRIORITIZED
               else jrb.UniformSamplingDistribution(seed))
    return jrb.ReplayBuffer(acc, sampler, batch_size=4, max_capacity=12)

def fill(b, n, start=0):
    for k in range(start, start + n):
        b.add(jrb.TransitionElement(np.full((3,), k % 251, np.uint8), k % 2, float(k), k % 7 == 6),
              **({"priority": 1.0} if PRIORITIZED else {}))

def snapshot(b):
    e = b.get_elements(b.keys())
    return (b.add_count, len(b), b.keys().tolist(),
            [np.asarray(getattr(e, f)).tolist() for f in jrb._ELEMENT_FIELDS])

src = make(0)
fill(src, 20)
src.save(DIRECTORY, 1)
(path,) = glob.glob(os.path.join(DIRECTORY, "1", "replay", "checkpoint.msgpack"))
genuine = open(path, "rb").read()
state = msgpack.unpackb(genuine, raw=False, strict_map_key=False)
add_count = state["add_count"]
keys = state["sampling_distribution"]["key_by_index"]
first = add_count - len(keys)
assert first > 3, (add_count, len(keys))  # so that INT64_MIN + 3 - first overflows

target = make(1)
fill(target, 9, start=200)
for bad in (INT64_MIN, INT64_MIN + 3, 2**63 - 1, first - 1, add_count):
    s = msgpack.unpackb(genuine, raw=False, strict_map_key=False)
    s["sampling_distribution"]["key_by_index"][0] = bad
    with open(path, "wb") as f:
        f.write(msgpack.packb(s, use_bin_type=True))
    before = snapshot(target)
    with pytest.raises(ProtocolError) as info:
        target.load(DIRECTORY, 1)
    message = str(info.value)
    assert isinstance(info.value, CheckpointError), repr(info.value)
    assert "checkpoint.msgpack" in message, message
    expected = f"key {bad} at index 0 is outside [{first}, {add_count})"
    assert expected in message, message
    assert snapshot(target) == before
    fill(target, 3, start=300)  # still adds and samples
    target.sample(4)

with open(path, "wb") as f:
    f.write(genuine)
target.load(DIRECTORY, 1)
assert snapshot(target) == snapshot(src)
print("SURVIVED")
"""


@pytest.mark.dopamine
@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_sampler_keys_anywhere_in_int64_are_refused_naming_the_range(tmp_path, prioritized):
    code = f"DIRECTORY = {str(tmp_path)!r}\nPRIORITIZED = {prioritized!r}\n" + textwrap.dedent(BODY)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(HELPERS),
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0 and "SURVIVED" in proc.stdout, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
