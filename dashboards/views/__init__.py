"""One module per page; each has ``page()`` (what ``st.Page`` runs) and a ``body(client, rng)``
re-run every ``dashboard.refresh_s`` as a fragment."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from dashboards.client import Client
from dashboards.common import Range


def run(title: str, question: str, body: Callable[[Client, Range], Any]) -> None:
    client: Client = st.session_state["gpuq_client"]
    rng: Range = st.session_state["gpuq_range"]
    st.title(title)
    st.caption(question)
    st.fragment(run_every=client.conf.refresh_s)(body)(client, rng)
