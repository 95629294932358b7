"""Reading back the batch scripts memoire writes for SLURM (``memoire sweep slurm``,
``memoire train --launcher slurm``)."""


def _directives(text):
    """{option: value} of the script's ``#SBATCH --name=value`` lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            name, _, value = line[len("#SBATCH ") :].partition("=")
            out[name] = value
    return out
