"""A failed distributed run ends with one clear line per failed rank and no launcher traceback."""

from __future__ import annotations

import pytest

from sentinel.distributed.launch import launch
from sentinel.distributed.runtime import Options
from sentinel.errors import RunError
from tests.distributed.helpers import LINE, write_scenario

pytestmark = pytest.mark.slow


@pytest.mark.timeout(200)
def test_a_crashed_rank_gives_one_line_per_rank_and_no_traceback(tmp_path):
    path = write_scenario(tmp_path, {**LINE, "training": {**LINE["training"], "steps": 20}})
    with pytest.raises(RunError) as info:
        launch(
            str(path),
            tmp_path / "out",
            nproc=4,
            options=Options(timeout_s=20, faults=("crash:s1r0:2",)),
            quiet=True,
            timeout_s=180,
            output=tmp_path / "out.log",
        )
    lines = str(info.value).splitlines()
    assert lines[0] == "dist run failed (4 ranks):"
    assert sorted(line.split(" (")[0].strip() for line in lines[1:]) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert "rank 2 (worker s1r0) died without reporting" in lines[1]
    output = (tmp_path / "out.log").read_text()
    assert "Traceback" not in output and "ChildFailedError" not in output, output
    assert "closing signal" not in output  # torchrun's agent keeps quiet too
