"""One line of parameters or results, as the console, the log and the commands show them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controller.core.brief import brief

ROOT = Path(__file__).resolve().parent.parent


def test_pairs_with_lists_said_plainly() -> None:
    assert brief({"count": 2, "launched": ["10001", "10002"], "errors": []}) == (
        "count=2 launched=10001,10002 errors=none"
    )
    assert brief({"instance": "10004", "block_host": True}) == "instance=10004 block_host=True"
    assert brief(None) == brief({}) == ""
    assert brief({"instance": "10004", "reason": ""}) == 'instance=10004 reason=""'


def test_the_console_line_of_a_launch_reads_as_the_readme_shows_it(tmp_path: Path) -> None:
    """The README's first console line, from a real `fleetgate tick` on the simulator."""
    code = "import sys; from controller.service.cli import main; sys.exit(main())"
    out = subprocess.run([sys.executable, "-c", code, "--state", str(tmp_path / "s"), "tick"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    [line] = [x for x in out.stderr.splitlines() if "] launch count=1 → ok (" in x]
    readme = (ROOT / "README.md").read_text()
    assert "launch count=1 → ok (launched=10001) | rule scale-to-proving-burst:" in readme
    assert line.split("] ", 1)[1].startswith(
        "launch count=1 → ok (launched=10001) | rule scale-to-proving-burst: "
    ), line
