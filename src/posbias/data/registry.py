"""The benchmark data sets posbias reads, each file pinned to its public original by commit and SHA-256.

A `DataSet` is a folder's worth of files (`nq/...`); each `DataFile` is either one `Source` file taken verbatim, or
built from its sources by a deterministic builder (data/build.py) where our copy is a selection or a rebuild of the
original. Every hash below was computed on the file itself: a source on the bytes committed at that commit, a data
file on the copy the documented figures came from (our machines' ../shared/data), which the builder reproduces byte
for byte (checked by tests/test_data_fetch.py on the copy, and against the originals themselves in docs/data.md).

    register_data(DataSet(...))   a plugin's data set joins `posbias data list / fetch / verify`; a taken name is refused
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..registry import Registry
from . import build

GITHUB = "https://raw.githubusercontent.com"  # {base}/{owner}/{repo}/{commit}/{path}: GitHub's raw file layout


@dataclass(frozen=True)
class Source:
    """One file of a public repository at a fixed commit."""

    repo: str  # owner/name on GitHub
    commit: str  # the full commit id
    path: str  # the file's path in the repository
    sha256: str
    size: int  # bytes

    def url(self, base: str = GITHUB) -> str:
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{self.path}"

    @property
    def key(self) -> str:
        """Where a download is kept, relative to the data folder (the URL's layout, under .sources/)."""
        return f".sources/{self.repo}/{self.commit}/{self.path}"


@dataclass(frozen=True)
class DataFile:
    """A file a task reads, relative to the data folder (`nq/nq-open-oracle.jsonl.gz`).

    build: None (the one source, verbatim) or a function from the downloaded sources (their paths, in order) to the
    file's bytes; content_sha256: for a .gz file built here, the hash of its decompressed bytes, which tells a zlib
    that compresses differently (the same records) from other data; how: one line on what the builder does."""

    name: str
    sha256: str
    size: int
    sources: tuple[Source, ...]
    build: Callable[[list[Path]], bytes] | None = None
    content_sha256: str | None = None
    how: str = "verbatim"


@dataclass(frozen=True)
class DataSet:
    """A named set of data files (`posbias data fetch NAME`)."""

    name: str
    description: str
    licence: str
    files: tuple[DataFile, ...]
    tasks: str  # the tasks (and options) that read it, for `posbias data list`

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def download_size(self) -> int:
        return sum(s.size for s in {s for f in self.files for s in f.sources})


DATASETS = Registry("data set")  # name -> DataSet


def register_data(dataset: DataSet) -> DataSet:
    """Add a data set (a plugin's); a taken name is refused, naming both origins."""
    return DATASETS.add(dataset.name, dataset)


# --- Lost in the Middle (Liu et al. 2023): the study's repository and a fork that committed its 20-document inputs ---

LITM = ("nelson-liu/lost-in-the-middle", "29b8a6d042ce29abccee3db1a73171a107d7e6af")
FORK = ("ViktorTorp/lost-in-the-middle", "a7a9725db6c3831f3c13be022022887b96fa6945")
LICENCE = Source(*LITM, "LICENSE", "972d3ea8cab53ed57cf52c1ff0f93c2d0616590a75d69eda5fbd65b836c9b896", 1067)
ORACLE = Source(*LITM, "qa_data/nq-open-oracle.jsonl.gz",
                "6a7f72b846f663a133ef952244e5a4e43f06bcf190afe34e8fbe687ce0d1653e", 900334)
# the study's 20-document files are over 4 MiB each; the fork's predictions file for gold at 0 (gpt-3.5, documents
# as given) carries the same inputs in 3.3 MB
FORK_GOLD0 = Source(*FORK, "qa_predictions/20_total_documents/gpt_reordered/"
                    "nq-open-20_total_documents_gold_at_0-gpt-35-reorder-predictions-scored.jsonl.gz",
                    "d8b8dd1f7f05a44ea314cac2328d437f19d8bc2bbfefe7997a0024812293f4d3", 3307681)


def _one(fn: Callable, name: str, mtime: int) -> Callable[[list[Path]], bytes]:
    return lambda paths: fn(*paths, name=name, mtime=mtime)


register_data(DataSet(
    "nq", "NQ-open multi-document QA in the Lost in the Middle format: 341 questions x 20 passages (the gold one first, "
    "19 retrieved distractors), and 2,555 questions with the gold passage alone (oracle, closed book)",
    "NQ: CC BY-SA 3.0; passages: Wikipedia, CC BY-SA; packaging: MIT (LICENSE-lost-in-the-middle)",
    (DataFile("nq/nq-open-20docs-gold_at_0.jsonl.gz", "0fb37f7fbfb6021946e577013616e33b6c9b759a5497f6e7e7403d2070cec8fd",
              1696396, (FORK_GOLD0,), _one(build.nq_20docs, "nq-open-20docs-gold_at_0.jsonl", 1795309950),
              "d51a7c932c8d641c330d742d4e8f4a2c9bac2b088c119c2155bde7fb142cda2b",
              f"the fork file's first {build.NQ_QUESTIONS} complete records, the study's input fields "
              f"({', '.join(build.NQ_KEYS)})"),
     DataFile("nq/nq-open-oracle.jsonl.gz", "5c516b73e4aad7c056ec2ef22e692268c96d92a1d9a01de2a538dfa39c9b9c7b",
              862967, (ORACLE,), _one(build.nq_oracle, "nq-open-oracle.jsonl", 1795309951),
              "87d3533897d008c84763ac5b6e8e5d267b2592dc395f1522978ff908169df9b3",
              "the study's oracle file less its records 341-440 (the fork file's other 100 questions)"),
     DataFile("nq/LICENSE-lost-in-the-middle", LICENCE.sha256, LICENCE.size, (LICENCE,))),
    "nq, judge-nq, mc-nq, niah (its default haystack; needle=nq)"))

register_data(DataSet(
    "kv-uuid", "synthetic key-value retrieval (Lost in the Middle): 500 examples of 75 and of 140 UUID pairs",
    "MIT",
    tuple(DataFile(f"kv/kv-retrieval-{n}_keys.jsonl.gz", sha, size,
                   (Source(*LITM, f"kv_retrieval_data/kv-retrieval-{n}_keys.jsonl.gz", sha, size),))
          for n, sha, size in ((75, "eb6d61fc3473349f2b86df76757c6ab659cc929d907d24caf1c69928e03f6203", 1667554),
                               (140, "66d54aae7e38779da482895ccd538faaf5309f144e54f30dc530a95091581fa1", 3104449))),
    "kv-uuid (pairs=75 and 140)"))

# MuSiQue-Ans (Trivedi et al. 2022) has no repository of its own files at a commit; three public repositories commit
# copies of its records: each one's answerable 2-hop questions, in this order, the first copy of each id kept
MUSIQUE = (
    (Source("AdelWang/MIGRES", "1de6265c9ca1014054d6ba875738e785830908f8", "data/musique.json",
            "bbc98ab676941cf3a481cb3361cfab334cd2a24c74ed42473e4d5c14cf7577d4", 2448034), "dev"),
    (Source("OpenSPG/KAG", "8901a93e04cd70c90e2fe029bb838a93c58c65ed",
            "kag/examples/musique_pike/solver/data/musique_qa_100.json",
            "7ee7b3f9533586b38d8ebe579dcb8d3daa8f52600b7777a6daa085ccac470467", 1467293), "dev"),
    (Source("OSU-NLP-Group/HippoRAG", "3d95d255a8db0c1699b853cfb4fbe5056708162d", "data/musique_train.json",
            "bca674746844637f5c68408a96b67bc0542d98e7c53715f3acafe144bd5e4ff4", 1179088), "train"),
)


def _musique(paths: list[Path]) -> bytes:
    sources = [(f"{s.repo}:{s.path}", split, p) for (s, split), p in zip(MUSIQUE, paths)]
    return build.musique_two_hop(*sources, name="musique_2hop_answerable.jsonl", mtime=1795309440)


register_data(DataSet(
    "musique", "MuSiQue-Ans answerable 2-hop questions, 20 paragraphs each: 260 questions (145 dev from MIGRES, 47 dev "
    "from KAG, 68 train from HippoRAG)",
    "MuSiQue: CC BY 4.0; copies from AdelWang/MIGRES (no licence file), OpenSPG/KAG (Apache-2.0), "
    "OSU-NLP-Group/HippoRAG (MIT)",
    (DataFile("musique/musique_2hop_answerable.jsonl.gz",
              "b50505248e48ea69d815180056e17b126baaf6f733dae21193907939d243a160", 971661,
              tuple(s for s, _ in MUSIQUE), _musique, "069bd5083d36798d25b5a4b36bdf228249aee0af11b9e9d0c59e30ff5acf3d77",
              "the three copies' answerable 2-hop records in order, the first of each id, with _source and _split"),),
    "musique"))
