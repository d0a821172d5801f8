"""The app's root URL: go to the overview (which has its own path, /overview), keeping the range."""
from __future__ import annotations

import streamlit as st

st.switch_page("views/overview.py", query_params=st.query_params.to_dict())
