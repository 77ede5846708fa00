"""The one grammar of scheme names (gradzip.schemes.spec): every registered, named, documented
and benchmarked spelling parses, round-trips, and builds the scheme its class would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gradzip
from gradzip.schemes import (
    SCHEMES,
    VARIANTS,
    ExchangeSpec,
    NestedScheme,
    ParameterServer,
    PowerSGD,
    SchemeSpec,
    make_scheme,
)
from gradzip_lab.bench.cluster_variants import VARIANT_TABLE

ROOT = Path(__file__).resolve().parents[2]


def compressor_for(name: str) -> gradzip.Compressor:
    return gradzip.create("ndqsg" if name == "nested" else "dqsg")


@pytest.mark.parametrize("text", [*SCHEMES, *VARIANTS])
def test_every_registered_name_and_variant_parses_and_round_trips(text: str) -> None:
    spec = SchemeSpec.parse(text)
    assert str(spec) == text
    assert SchemeSpec.parse(str(spec)) == spec
    scheme = make_scheme(text, compressor_for(spec.name))
    assert isinstance(scheme, SCHEMES[spec.name])


def test_the_bare_names_the_docs_use_build_their_scheme() -> None:
    """``ps`` (the README's scheme name) is the parameter server with its defaults."""
    ps = make_scheme("ps", gradzip.create("dqsg"))
    assert isinstance(ps, ParameterServer) and ps.downlink == "fp32"
    assert make_scheme("ps", gradzip.create("dqsg"), downlink="requantize").downlink == "requantize"


def test_options_become_the_class_keyword_arguments() -> None:
    spec = SchemeSpec.parse("powersgd[r1,allreduce,start2]")
    assert spec.kwargs() == {"rank": 1, "factor_scheme": "allreduce", "start_step": 2}
    built = spec.build(gradzip.create("qsgd", s=127), run_seed=4, error_feedback=True)
    assert isinstance(built, PowerSGD)
    assert (built.rank, built.factor_scheme, built.start_step) == (1, "allreduce", 2)
    assert (built.run_seed, built.error_feedback) == (4, True)
    nested = SchemeSpec.parse("nested[server,dqsg-downlink]").build(gradzip.create("ndqsg"))
    assert isinstance(nested, NestedScheme)
    assert (nested.topology, nested.downlink) == ("server", "dqsg")
    # key=value for any option a text can give; written back in the class's parameter order
    spec = SchemeSpec.parse("powersgd[min_compression_rate=4,r2]")
    assert spec.kwargs() == {"rank": 2, "min_compression_rate": 4.0}
    assert str(spec) == "powersgd[r2,min_compression_rate=4.0]"
    assert SchemeSpec.parse("ps[downlink=requantize]") == SchemeSpec.parse("ps[requantize]")
    assert SchemeSpec.parse("nested[record=true]").kwargs() == {"record": True}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("butterfly", "unknown scheme 'butterfly'; choose one of allgather, ps,"),
        ("ps[x]", "scheme 'ps' has no option 'x'; its options: fp32 or requantize (downlink)"),
        ("nested[dqsg]", "<fp32|dqsg>-downlink"),
        ("powersgd[r1,r2]", "rank is given twice"),
        ("powersgd[rank=x]", "scheme 'powersgd' option rank takes int, got 'x'"),
        ("powersgd[error_feedback=true]", "has no option 'error_feedback'"),
        ("ps[]", "an empty option"),
        ("ps[fp32", "a scheme is written name[option,...]"),
        ("ring[requantize]", "scheme 'ring' has no option 'requantize'"),
    ],
)
def test_a_wrong_spec_is_refused_with_what_the_scheme_takes(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SchemeSpec.parse(text)


@pytest.mark.parametrize("variant", VARIANT_TABLE, ids=lambda v: v.name)
def test_every_bench_variant_name_round_trips_and_builds(variant: object) -> None:
    from gradzip_lab.bench.cluster_variants import Variant

    assert isinstance(variant, Variant)
    if variant.kind != "gradzip":
        return
    spec = ExchangeSpec.parse(variant.name)
    assert str(spec) == variant.name and spec == variant.spec
    assert spec.compressor == variant.compressor and dict(spec.params) == variant.params
    assert spec.error_feedback == variant.error_feedback
    scheme = spec.build(run_seed=3)
    assert scheme.error_feedback == variant.error_feedback
    assert type(scheme) is spec.scheme.scheme_class


def test_exchange_specs_refuse_unknown_compressors_and_parameters() -> None:
    with pytest.raises(ValueError, match="unknown compressor 'nope'"):
        ExchangeSpec.parse("gradzip:nope:ring")
    with pytest.raises(ValueError, match="compressor 'dqsg' takes key=value parameters of M,"):
        ExchangeSpec.parse("gradzip:dqsg[K=2]:ring")
    with pytest.raises(ValueError, match="an exchange is written"):
        ExchangeSpec.parse("dqsg:ring")


def _documented_specs() -> set[str]:
    """Scheme specs written in the README and the docs: ``make_scheme("...")`` and
    ``--scheme ...`` arguments, the table's scheme names and ``gradzip:...`` bench names."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found: set[str] = set()
    for path in texts:
        text = path.read_text()
        found |= set(re.findall(r'make_scheme\(\s*"([^"]+)"', text))
        found |= set(re.findall(r"--scheme[ =]'?([a-z_]+(?:\[[^\]\s']*\])?)", text))
        for table in re.findall(r"^\| scheme \(.*\n((?:\|.*\n)+)", text, re.M):
            found |= set(re.findall(r"^\| `([a-z_]+)`", table, re.M))  # a table of schemes
    return found


DOCUMENTED = sorted(_documented_specs())


def test_the_docs_name_schemes() -> None:
    assert {"ps", "allgather", "ring", "powersgd"} <= set(DOCUMENTED)


@pytest.mark.parametrize("text", DOCUMENTED)
def test_every_documented_scheme_spec_parses(text: str) -> None:
    assert str(SchemeSpec.parse(text)) == text


def _documented_exchanges() -> set[str]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pattern = r"gradzip:[a-z0-9_]+(?:\[[^\]\s`']*\])?(?:\+ef)?:[a-z_]+(?:\[[^\]\s`']*\])?"
    return {m for path in texts for m in re.findall(pattern, path.read_text())}


def test_every_documented_bench_name_of_the_table_parses() -> None:
    """The bench names the docs write, as far as they are the table's (older stored results
    may keep their old labels), parse and round-trip."""
    table = {v.name for v in VARIANT_TABLE}
    for text in _documented_exchanges() & table:
        assert str(ExchangeSpec.parse(text)) == text


@pytest.mark.parametrize("name", SCHEMES)
def test_error_feedback_is_off_by_default_for_every_scheme(name: str) -> None:
    """One default for the one spelling of error feedback, the scheme's flag: off, PowerSGD
    included (the recommended set-ups pass ``error_feedback=True``)."""
    import inspect

    cls = SCHEMES[name]
    assert inspect.signature(cls.__init__).parameters["error_feedback"].default is False
    assert cls(compressor_for(name)).error_feedback is False
    assert make_scheme(name, compressor_for(name)).error_feedback is False
    if name != "nested":  # it keeps no residuals (the sender cannot know what it decodes to)
        assert cls(compressor_for(name), error_feedback=True).error_feedback is True


def test_gradient_sync_takes_error_feedback_from_its_scheme_only() -> None:
    import inspect

    from gradzip.comm.local import LocalGroup
    from gradzip.schemes import AllGatherDecode
    from gradzip.sync import GradientSync

    assert "error_feedback" not in inspect.signature(GradientSync).parameters
    transport = LocalGroup(1).endpoint(0)
    assert not GradientSync(transport, gradzip.create("topk", k=2)).scheme.error_feedback
    scheme = AllGatherDecode(gradzip.create("topk", k=2), error_feedback=True)
    assert GradientSync(transport, scheme=scheme).scheme.error_feedback
    assert "ErrorFeedback" not in gradzip.__all__ and "ErrorFeedback" not in gradzip.schemes.__all__
