"""The turbopuffer backend's own logic. Against the real service it runs in the contract
suite when TURBOPUFFER_API_KEY is set; nothing here pretends to be the service."""

import numpy as np
import pytest

from puffergpt.stores.base import StoreError
from puffergpt.stores.turbopuffer import MULTI_QUERY, TurbopufferStore, tpuf_filter


def test_filters_translate_to_turbopuffer():
    assert tpuf_filter((("matrix", "=", "h.0.mlp.c_fc"),)) == ("matrix", "Eq", "h.0.mlp.c_fc")
    assert tpuf_filter((("layer", "=", np.int64(3)), ("pos", "<=", 7), ("head", "in", (1, 2)))) == (
        "And", [("layer", "Eq", 3), ("pos", "Lte", 7), ("head", "In", [1, 2])])
    assert isinstance(tpuf_filter((("layer", "=", np.int64(3)),))[2], int)  # JSON-ready, not numpy
    assert tpuf_filter(()) is None


def test_needs_an_api_key():
    with pytest.raises(StoreError, match="TURBOPUFFER_API_KEY"):
        TurbopufferStore(api_key=None, region="gcp-us-central1")


def test_limits_match_the_service():
    assert MULTI_QUERY == 16  # the service takes at most 16 sub-queries a request
    assert TurbopufferStore.metrics == ("cosine_distance", "euclidean_squared")  # no inner product there
