"""Benchmark data: which public files posbias reads, where it finds them, and how it fetches them (docs/data.md).

    import posbias.data

    posbias.data.fetch(["nq"])        # download the pinned originals, rebuild our copy, verify: what `posbias data fetch nq` does
    posbias.data.require("nq")        # the folder nq is read from (lookup order: data/lookup.py), or DataMissing
    posbias.data.verify(["all"])      # every file where a task would read it, against its pinned SHA-256

`DATASETS` holds the registered data sets (`DataSet`: `DataFile`s, each a verbatim `Source` or built from its
sources); `register_data` adds one (a plugin's). A task names the data sets it needs when it is registered
(`register_task(..., data=...)`), so a command refuses missing data before it loads a model.
"""

from .download import FileState as FileState
from .download import fetch as fetch
from .download import listing as listing
from .download import verify as verify
from .lookup import ENV as ENV
from .lookup import DataMissing as DataMissing
from .lookup import cache_dir as cache_dir
from .lookup import data_file as data_file
from .lookup import locate as locate
from .lookup import provenance as provenance
from .lookup import require as require
from .lookup import roots as roots
from .registry import DATASETS as DATASETS
from .registry import DataFile as DataFile
from .registry import DataSet as DataSet
from .registry import Source as Source
from .registry import register_data as register_data

__all__ = ["DATASETS", "DataFile", "DataMissing", "DataSet", "ENV", "FileState", "Source", "cache_dir", "data_file",
           "fetch", "listing", "locate", "provenance", "register_data", "require", "roots", "verify"]
