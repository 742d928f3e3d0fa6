"""The seams a reader can see: each Protocol and the implementations that meet it (issue 55).

A Protocol's abstract methods are its contract: an implementation that lacks one is refused when constructed, not
when a site first calls the method in production."""
import inspect

import pytest

from hilo.consumer.engine import Engine
from hilo.consumer.vllm_serving import VllmServer
from hilo.log.base import Log
from hilo.log.filelog import FileLog
from hilo.log.kafka.backend import KafkaLog
from hilo.producer.producer import HiLoProducer
from hilo.producer.rank_trainer import RankProducer
from hilo.producer.trainer import Trainer

IMPLEMENTATIONS = [(Log, FileLog), (Log, KafkaLog), (Engine, VllmServer)]


@pytest.mark.parametrize("protocol, impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_implementation_defines_every_method_of_its_protocol(protocol, impl):
    assert protocol in impl.__mro__ and not inspect.isabstract(impl), sorted(getattr(impl, "__abstractmethods__", ()))


@pytest.mark.parametrize("protocol", [Log, Engine], ids=lambda c: c.__name__)
def test_an_implementation_missing_a_method_is_refused_when_constructed(protocol):
    missing = sorted(protocol.__abstractmethods__)[0]
    partial = type("Partial", (protocol,),
                   {m: (lambda self, *a, **k: None) for m in protocol.__abstractmethods__ if m != missing})
    with pytest.raises(TypeError, match=missing):
        partial()


def test_both_trainers_meet_the_trainer_protocol():
    members = [n for n in dir(Trainer) if not n.startswith("_")]  # methods and properties (attributes: set in __init__)
    assert {"step", "version", "replica", "close"} <= set(members)
    for impl in (HiLoProducer, RankProducer):
        lacking = [n for n in members if not hasattr(impl, n)]
        assert not lacking, (impl.__name__, lacking)
    assert inspect.signature(HiLoProducer.open).return_annotation is Trainer
