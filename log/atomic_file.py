"""Replacing a small file atomically (the embedded log's group positions and writer tokens): all of it or none.

A write that fails (no space, an I/O error, no permission) leaves the old file in place and no temp file behind,
and raises the OSError for the caller to say in its own words.
"""
import contextlib
import os
import pathlib


def replace(path: pathlib.Path, text: str) -> None:
    """Write `text` to PATH.tmpPID, fsync it and rename it over `path`; on OSError remove the temp file and re-raise
    (naming the file)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        e.filename = e.filename or str(tmp)  # a failed write or fsync names no file
        raise


def why(error: OSError) -> str:
    """An OSError in a few words: the file and its cause ("no space left on device")."""
    return f"{error.filename}: {(error.strerror or type(error).__name__).lower()}" if error.filename else \
        (error.strerror or str(error)).lower()
