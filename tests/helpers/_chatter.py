"""What other packages print that memoire's commands keep out of their output at the default
log level (memoire.cli.quiet_third_party), for tests that count a command's lines."""

import re

# TensorFlow's and absl's C++ log lines, CUDA plugin registration, graph placement, gym's and
# gymnasium's notices, deprecation warnings, Dopamine's and orbax's notices, the ALE's banner,
# tqdm bars and Dopamine's per-episode stdout lines.
CHATTER = re.compile(
    r"absl::InitializeLog|^[IWEF]\d{4} [\d:.]+ +\d+ \S+\.cc:\d+\]"
    r"|^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+\.cc:\d+\]|colocation_graph|Failed to place the graph"
    r"|Gym has been unmaintained|is out of date|DeprecationWarning|Instructions for updating"
    r"|No registered CheckpointArgs|deprecated legacy API|Logger is being deprecated"
    r"|A\.L\.E: Arcade Learning Environment|Powered by Stella|it/s\]|Steps executed"
)


def chatter(text: str) -> list:
    """The lines of ``text`` that are other packages' chatter."""
    return [line for line in text.splitlines() if CHATTER.search(line)]


def check_quiet(out, most_lines: int) -> list:
    """Checks a finished ``memoire train`` (a CompletedProcess, text) at the default level:
    nothing on stdout (a training command has no result to print), no chatter on stderr, at
    most ``most_lines`` lines there. Returns the stderr lines."""
    assert out.stdout == "", out.stdout[-2000:]
    lines = out.stderr.splitlines()
    assert chatter(out.stderr) == [], out.stderr[-3000:]
    assert len(lines) <= most_lines, out.stderr[-3000:]
    return lines
