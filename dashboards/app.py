"""The gpuq dashboards: ``gpuq dashboard`` runs ``streamlit run dashboards/app.py -- --config FILE``.

Every page reads the gpuq HTTP API through :mod:`dashboards.client` (never the store), answers
one question with a row of numbers, the chart that explains them and the table to drill into,
and keeps the time range in the URL (``?range=7d``).
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboards.client import Client, conf
from dashboards.common import time_range

VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="gpuq", page_icon=":material/memory:", layout="wide")
settings = conf()
st.session_state["gpuq_client"] = Client(settings)
st.markdown("<style>[data-testid='stMetricValue'] {font-size: 1.6rem;} "
            "[data-testid='stMainBlockContainer'] {padding-top: 2.5rem;}</style>", unsafe_allow_html=True)
pages = [
    st.Page(VIEWS / "overview.py", title="Overview", url_path="overview", icon=":material/dashboard:"),
    st.Page(VIEWS / "queues.py", title="Queues", url_path="queues", icon=":material/account_tree:"),
    st.Page(VIEWS / "gpu_types.py", title="GPU types", url_path="gpu-types", icon=":material/memory:"),
    st.Page(VIEWS / "idle.py", title="Idle GPUs", url_path="idle", icon=":material/hourglass_empty:"),
    st.Page(VIEWS / "scheduler.py", title="Scheduler", url_path="scheduler", icon=":material/schedule:"),
    st.Page(VIEWS / "cost.py", title="Cost", url_path="cost", icon=":material/payments:"),
    st.Page(VIEWS / "tenant.py", title="My queue", url_path="my-queue", icon=":material/person:"),
]
# the root URL is a page of its own that goes to /overview: the default page of st.navigation is
# served at "/" only, and every page here keeps a path of its own
home = st.Page(VIEWS / "home.py", title="gpuq", url_path="home", default=True)
nav = st.navigation([home, *pages], position="hidden")
links = st.sidebar.container()
st.sidebar.divider()
rng = time_range()
st.session_state["gpuq_range"] = rng
for p in pages:                              # the links carry the range to the next page
    links.page_link(p, query_params={"range": rng.key}, width="stretch")
st.sidebar.caption(f"API {settings.api_url} · refreshes every {settings.refresh_s:g} s")
nav.run()
