"""Regenerate the committed conformance vectors (tests/conformance/vectors/): every run of runs.RUNS written by the
product onto a fresh embedded log, only the two `records` files of each kept, and expected.json beside them.

    PYTHONPATH=<worktree>/.shim python -m tests.conformance.make_vectors [--out tests/conformance/vectors]

Run it after a change to the wire format or the arithmetic (a new `math` or `digest_version`), then commit the
result."""
import argparse
import pathlib
import shutil
import tempfile

from tests.conformance.runs import RUNS, produce, write_expected

VECTORS = pathlib.Path(__file__).parent / "vectors"


def main(argv=None) -> None:
    """Write every run's records and expected digests under --out (replacing what was there)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=VECTORS)
    args = ap.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    for name in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            expected = produce(name, pathlib.Path(tmp))
            dest = args.out / name
            for topic in ("updates", "checkpoints"):  # writer.json and groups/ are not the run's bytes
                (dest / f"{name}.{topic}").mkdir(parents=True)
                shutil.copyfile(pathlib.Path(tmp) / "log" / f"{name}.{topic}" / "records",
                                dest / f"{name}.{topic}" / "records")
            write_expected(dest, expected)
        print(f"{name}: {len(expected['digests'])} versions")


if __name__ == "__main__":
    main()
