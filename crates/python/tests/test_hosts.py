"""The adapters on the real hosts, where they are installed (opt-in: ``pytest -m torch``,
``pytest -m llama_cpp``). Each test says why it is skipped when its host is absent.

- transformers + torch: a small Llama built from a config with seeded random weights (no
  download), ``generate`` with nextok's processor and with ``custom_generate``.
- llama-cpp-python: the default model (SmolLM2-135M-Instruct Q4_1 from the test data);
  ``bench/llama_cpp_adapter.sh`` builds llama-cpp-python from source and runs these.
"""

from __future__ import annotations

import numpy as np
import pytest

import nextok

from conftest import require_data


def _transformers():
    torch = pytest.importorskip("torch", reason="torch is not installed here (several GB; opt-in: pytest -m torch)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed here")
    return torch, transformers


@pytest.fixture(scope="module")
def tiny_llama():
    torch, transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    # larger weights than the initialiser's give peaked, varied rows
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return torch, transformers, model


def _vocab() -> nextok.Vocab:
    toks = [b"<pad>", b"<s>", b"</s>"] + [bytes([33 + i]) for i in range(93)]
    return nextok.Vocab.from_token_bytes(toks, eos_token_ids=[2], special_token_ids=[0, 1, 2])


def _sampler(**kw) -> nextok.Sampler:
    return nextok.Sampler(nextok.Pipeline("reference", temperature=1.0, top_p=0.95), _vocab(), **kw)


def _solo(torch, model, sampler, prompt, seed, steps):
    """nextok on the model's own logits, one full forward per step (no cache, no batch)."""
    state = sampler.new_state(seed=seed, prompt_ids=prompt)
    ids = list(prompt)
    out = []
    with torch.no_grad():
        while len(out) < steps and not state.finished:
            logits = model(torch.tensor([ids])).logits[0, -1].float().numpy()
            t = sampler.step(np.ascontiguousarray(logits), state).token
            out.append(t)
            ids.append(t)
    return out


@pytest.mark.torch
def test_transformers_generate_picks_nextoks_tokens(tiny_llama):
    torch, transformers, model = tiny_llama
    from nextok.integrations.transformers import NextokLogitsProcessor

    prompt = [1, 40, 41, 42, 43]
    s = _sampler()
    want = _solo(torch, model, s, prompt, 7, 12)
    got = []
    for kwargs in ({"do_sample": False}, {"do_sample": True, "temperature": 3.0, "top_k": 5}):
        proc = NextokLogitsProcessor(s, seed=7, logprobs=1)
        out = model.generate(
            torch.tensor([prompt]), logits_processor=[proc], max_new_tokens=12, pad_token_id=0, **kwargs
        )
        got.append(out[0, len(prompt) :].tolist())
        assert len(proc.sequences[0].steps) == len(got[-1])
    # the host's own sampling settings do not change a token: nextok picked every one
    assert got[0] == got[1]
    assert got[0][: len(want)] == want


@pytest.mark.torch
def test_transformers_rows_do_not_depend_on_the_batch(tiny_llama):
    torch, transformers, model = tiny_llama
    from nextok.integrations.transformers import NextokLogitsProcessor

    s = _sampler()
    prompts = [[1, 50, 51, 52], [1, 60, 61, 62, 63, 64]]
    alone = []
    for p, seed in zip(prompts, [3, 4]):
        proc = NextokLogitsProcessor(s, seed=seed)
        out = model.generate(torch.tensor([p]), logits_processor=[proc], max_new_tokens=8, do_sample=False, pad_token_id=0)
        alone.append(out[0, len(p) :].tolist())
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long()
    proc = NextokLogitsProcessor(s, seed=[3, 4], pad_token_id=0)
    out = model.generate(ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=8, do_sample=False, pad_token_id=0)
    batch = [out[i, width:].tolist() for i in range(2)]
    assert batch == alone


@pytest.mark.torch
def test_transformers_custom_generate_stops_on_nextoks_finish(tiny_llama):
    torch, transformers, model = tiny_llama
    from nextok.integrations.transformers import NextokLogitsProcessor, generate

    prompt = [1, 70, 71]
    s = _sampler(max_tokens=5)
    want = _solo(torch, model, s, prompt, 9, 5)
    proc = NextokLogitsProcessor(s, seed=9)
    out = model.generate(
        torch.tensor([prompt]),
        custom_generate=generate,
        nextok=proc,
        max_new_tokens=40,
        do_sample=True,
        temperature=0.3,
        repetition_penalty=5.0,
        pad_token_id=0,
    )
    assert out[0, len(prompt) :].tolist() == want  # nextok's max_tokens ended it, not max_new_tokens


@pytest.fixture(scope="module")
def llama():
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed here (opt-in: bash bench/llama_cpp_adapter.sh)"
    )
    path = require_data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return llama_cpp, llama_cpp.Llama(str(path), n_ctx=512, n_threads=2, verbose=False), path


@pytest.mark.llama_cpp
def test_llama_cpp_completion_is_nextoks_whatever_the_hosts_sampler(llama):
    llama_cpp, llm, path = llama
    from nextok.integrations.llama_cpp import NextokLogitsProcessor

    texts, ids = [], []
    for host in ({"temperature": 0.0}, {"temperature": 1.5, "top_k": 3, "seed": 99}):
        proc = NextokLogitsProcessor.for_llama(llm, "llama.cpp", temperature=0.8, top_p=0.9, seed=7, logprobs=2)
        out = llm.create_completion(
            "The capital of France is",
            max_tokens=24,
            logits_processor=llama_cpp.LogitsProcessorList([proc]),
            **host,
        )
        proc.check()
        texts.append(out["choices"][0]["text"])
        ids.append(proc.sequence.state.output_ids)
        # every token the host generated is the one nextok selected
        assert out["usage"]["completion_tokens"] <= len(proc.sequence.steps)
    assert texts[0] == texts[1] and ids[0] == ids[1]
    assert texts[0].strip()


@pytest.mark.llama_cpp
def test_llama_cpp_stop_string_and_vocab_from_the_gguf(llama):
    llama_cpp, llm, path = llama
    from nextok.integrations.llama_cpp import NextokLogitsProcessor

    proc = NextokLogitsProcessor.for_llama(llm, "reference", temperature=0.0, stop=["."], seed=1)
    out = llm.create_completion(
        "The capital of France is", max_tokens=40, logits_processor=llama_cpp.LogitsProcessorList([proc])
    )
    proc.check()
    text = out["choices"][0]["text"]
    # greedy, the model goes on past "Paris." for the whole budget; nextok's stop string ends
    # the completion at the first "." (the token holding it is the last; EOS is forced next)
    assert proc.sequence.finished and proc.sequence.state.finish_reason == "stop_string"
    assert text.rstrip().endswith(".") and text.count(".") == 1, text


@pytest.mark.vllm
def test_vllm_v2_class_on_vllms_own_types():
    """The V2 class built on vLLM's base class, fed vLLM's own ``SamplingParams`` and
    ``LogitsContext`` with torch tensors (CPU: vLLM's runner itself needs a CUDA GPU)."""
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    pytest.importorskip("vllm", reason="vLLM is not installed here (its runners need a CUDA GPU; opt-in: pytest -m vllm)")
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as Base
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

    from nextok.integrations import vllm as vl

    V = 40
    toks = [bytes([65 + i]) for i in range(V - 1)] + [b"</s>"]
    vocab = nextok.Vocab.from_token_bytes(toks, eos_token_ids=[V - 1])

    class States:  # the buffers of LogitsProcRequestState, on the CPU
        all_token_ids = torch.zeros((2, 32), dtype=torch.int32)
        prompt_len = torch.tensor([3, 0], dtype=torch.int32)
        prefill_len = torch.tensor([3, 0], dtype=torch.int32)

    states = States()
    states.all_token_ids[0, :3] = torch.tensor([5, 6, 7])

    class ModelConfig:
        tokenizer = model = None

        def get_vocab_size(self) -> int:
            return V

    class Config:
        model_config = ModelConfig()

    cls = vl.NextokLogitsProcessor
    assert issubclass(cls, Base)
    import pickle

    assert pickle.loads(pickle.dumps(cls)) is cls  # vLLM may send the class to its engine process
    with pytest.raises(ValueError):
        cls.validate_params(SamplingParams(extra_args={"nextok": {"top_p": 2.0}}))
    params = SamplingParams(seed=4, extra_args={"nextok": {"pipeline": "vllm", "temperature": 0.9, "seed": 11}})
    cls.validate_params(params)
    proc = cls(Config(), states)
    proc._slots.factory = vl.RequestFactory(vocab)
    assert proc.add_request(0, params) is True
    assert proc.add_request(1, SamplingParams()) is False

    sampler = proc._slots.factory.sampler(params.extra_args["nextok"])
    state = sampler.new_state(seed=11, prompt_ids=[5, 6, 7])
    gen = torch.Generator().manual_seed(0)
    length = 3
    for _ in range(5):
        logits = torch.randn((2, V), generator=gen)
        want = sampler.step(logits[0].numpy().copy(), state).token
        other = logits[1].clone()
        ctx = LogitsContext(
            expanded_idx_mapping=torch.tensor([0, 1]),
            idx_mapping=torch.tensor([0, 1]),
            idx_mapping_np=np.array([0, 1]),
            expanded_local_pos=torch.tensor([0, 0]),
            input_ids=torch.tensor([int(states.all_token_ids[0, length - 1]), 0]),
            pos=torch.tensor([length - 1, 0]),
            seq_lens_upper_bound_np=np.array([length, 1]),
        )
        out = proc.apply(logits, ctx)
        assert int(torch.argmax(out[0])) == want and int(torch.isfinite(out[0]).sum()) == 1
        assert torch.equal(out[1], other)  # not a nextok request: untouched
        states.all_token_ids[0, length] = want
        length += 1
