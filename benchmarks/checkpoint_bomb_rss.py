"""Peak RSS of a TF-face checkpoint load whose episode_end_indices file is a gzip bomb.

Usage: PYTHONPATH=. python benchmarks/checkpoint_bomb_rss.py [MiB inflated, default 2048]
(A decompression bomb: before the size budget, a 2 MB bomb inflating to 2 GiB raised peak RSS by
about 4 GiB before the load failed; with it, the load fails having inflated 64 KiB or so).
"""

import os
import resource
import sys
import tempfile

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "helpers")
)
import _hostile as h  # noqa: E402

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
d = tempfile.mkdtemp()
b = h.small_buffer(False)
h.fill(b, 23)
h.saved(b, d)
bomb = h.gzip_bomb(mib << 20)
with open(h.path(d, "episode_end_indices"), "wb") as f:
    f.write(bomb)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    b.load(d, 0)
except Exception as e:
    print(type(e).__name__, str(e)[-90:])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(
    "bomb file {:.2f} MB -> {} MiB inflated; "
    "peak RSS before load {} MiB, after {} MiB (+{} MiB)".format(
        len(bomb) / 1e6, mib, base // 1024, peak // 1024, (peak - base) // 1024
    )
)
