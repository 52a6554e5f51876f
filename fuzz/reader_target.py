"""atheris target: the fast reader and the verifier on arbitrary bytes.

Any input must end in a report or a SmoeError; any other exception, a hang (-timeout) or
memory blow-up (-rss_limit_mb) is a crash, and libFuzzer saves the input.

    python -m fuzz.reader_target CORPUS_DIR [libFuzzer flags]
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    import numpy as np

    from smoe.errors import SmoeError
    from smoe.format.verify import verify
    from smoe.vault.reader import Vault


def one_input(data: bytes) -> None:
    arr = np.frombuffer(data, np.uint8)
    report = verify(arr, deep=True)
    for f in report.findings:
        f.line()
    try:
        v = Vault.from_array(arr)
    except SmoeError:
        return
    for key in v:
        try:
            e = v.expert(*key)
        except SmoeError:
            return
        for t in e.tensors:
            t.dequantize()


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
