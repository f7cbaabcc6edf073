"""A full disk while writing predictions names the file and the fix (tasks/runtime/writes.py,
issue 24): the real ``PredictionWriter`` writes into ``/dev/full``, whose every write fails
with ``ENOSPC`` in the kernel, the lowest level there is, without mounting a full disk."""

from __future__ import annotations

import errno
from pathlib import Path

import pyarrow as pa
import pytest

from tasks.runtime.errors import UserError
from tasks.runtime.writes import named_write_errors
from tasks.stages.write import PredictionWriter

FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs Linux's /dev/full")


def test_no_space_while_writing_predictions_names_the_path_and_cleans_up(tmp_path):
    writer = PredictionWriter(tmp_path / "out" / "predictions.parquet")
    (tmp_path / "out").mkdir()
    writer.tmp.symlink_to(FULL)  # the writer's temporary file is on a full "disk"
    table = pa.table({"c_id": pa.array(range(50_000), pa.int64()), "score": pa.array([0.5] * 50_000)})
    with pytest.raises(UserError) as err, named_write_errors(writer.path, "predictions", "run.output_dir"):
        writer.write(table)  # a chunk's write, as tasks/run/chain.py does it
        writer.commit()  # the rest of the file: flows/benchmark.py's collect
    msg = str(err.value)
    assert "\n" not in msg  # one line: the CLI prints it as the whole story
    assert f"Writing predictions to '{writer.path}' failed: No space left on device (ENOSPC)" in msg
    assert f"in '{tmp_path / 'out'}'" in msg and "free space on that disk" in msg and "run.output_dir" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no chained library traceback
    writer.abort()  # what the flow does on the way out
    assert list((tmp_path / "out").iterdir()) == []  # the temporary file is gone, no predictions file


@pytest.mark.parametrize(
    ("code", "fix"),
    [(errno.EDQUOT, "free space on that disk"), (errno.EROFS, "check the file system's limits")],
)
def test_other_disk_limits_are_named_too(code, fix, tmp_path):
    with (
        pytest.raises(
            UserError, match=rf"\({errno.errorcode[code]}\) in .{tmp_path}.\. Nothing was kept; {fix}.*, or set --out"
        ),
        named_write_errors(tmp_path / "m.ckpt", "the quantized checkpoint", "--out"),
    ):
        raise OSError(code, "limit")


def test_errors_the_user_cannot_fix_by_moving_the_file_pass_unchanged(tmp_path):
    with pytest.raises(OSError) as err, named_write_errors(tmp_path / "p.parquet", "predictions", "run.output_dir"):
        raise OSError(errno.EIO, "Input/output error")
    assert not isinstance(err.value, UserError) and err.value.errno == errno.EIO
