"""YuniKorn's queue configuration as a gpuq queue file (issue 20): :func:`from_yunikorn`."""
from __future__ import annotations
