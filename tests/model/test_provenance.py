"""The in-toto/SLSA provenance statement of a published image, from its labels (issue 39, item 5)."""

from __future__ import annotations

from dedal.model.provenance import PREDICATE_TYPE, STATEMENT_TYPE, statement, summary


def test_statement_records_the_inputs_and_summary_reads_them_back():
    labels = {
        "dedal.env": "esd",
        "dedal.tag": "2025.1",
        "dedal.lock.sha256": "sha256:" + "1" * 64,
        "dedal.spack.commit": "c" * 40,
        "dedal.base.image": "debian-trixie",
        "dedal.base.sha256": "2" * 64,
        "dedal.runtime_base.image": "debian-trixie-runtime",
        "dedal.source_date_epoch": "0",
        "dedal.layers.digest": "3" * 64,
        "dedal.layers.count": "12",
        "unrelated": "x",
    }
    s = statement(
        labels, name="esd.sif", sha256="sha256:" + "f" * 64, source="https://git.example.org/esd", revision="abc"
    )
    assert s["_type"] == STATEMENT_TYPE and s["predicateType"] == PREDICATE_TYPE
    assert s["subject"] == [{"name": "esd.sif", "digest": {"sha256": "f" * 64}}]
    deps = {d["name"]: d for d in s["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["spack"]["digest"] == {"gitCommit": "c" * 40} and deps["spack.lock"]["digest"] == {"sha256": "1" * 64}
    assert deps["base:debian-trixie"]["digest"] == {"sha256": "2" * 64}
    assert "digest" not in deps["runtime-base:debian-trixie-runtime"]  # no content label: no digest claimed
    flat = summary(s)
    assert flat["env"] == "esd" and flat["source_date_epoch"] == "0" and flat["layers"] == "sha256:" + "3" * 64
    assert flat["source"] == {"uri": "https://git.example.org/esd", "revision": "abc"}
    assert "unrelated" not in str(s)
    assert summary({"_type": "something else"}) is None and summary([1]) is None
