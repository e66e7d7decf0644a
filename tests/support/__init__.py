"""What tests share: fakes of the services gpucredit talks to, real helper services,
and the helpers more than one test module uses (one place each, public names).

REPO is the checkout; FIXTURES the recorded Slurm/NVML data under tests/fixtures/.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
