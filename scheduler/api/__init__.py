"""The operator API (FastAPI): ``create_app(service, accounting, settings)``; see docs/API.md."""
from scheduler.api.app import create_app

__all__ = ["create_app"]
