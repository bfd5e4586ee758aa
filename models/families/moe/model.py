"""Router capture for mixture-of-experts transformers: which experts each token was sent to, per MoE layer.

A sparse MoE layer (Shazeer et al. 2017) replaces the FFN with E experts and a router ``g(x) = W_r x``; each token
goes to the top-k experts and the layer returns ``y = Σ_{i ∈ topk} w_i · E_i(x)`` (+ shared experts where the family
has them). The families differ only in how ``w`` is made from the logits, and this module records exactly that:

- Switch Transformers (Fedus et al. 2021, eq. 1-2): top-1 of softmax(logits), ``w`` = that probability (no
  renormalisation); an expert takes at most ``expert_capacity`` tokens per sequence, the rest are *dropped* (they
  skip the FFN through the residual).
- Mixtral (Jiang et al. 2024, eq. 2), OLMoE, Qwen-MoE with ``norm_topk_prob``: top-k of softmax(logits), the k
  weights renormalised to sum to 1 (= softmax over the k chosen logits). Qwen2-MoE adds one shared expert scaled by
  ``sigmoid(w_s · x)``.
- DeepSeek-V3: top-k of ``sigmoid(logits) + bias`` (bias for the choice only), weights = sigmoid scores, renormalised
  and multiplied by ``routed_scaling_factor``; shared experts always on with weight 1. DeepSeek-V4 scores with
  ``sqrt(softplus(logits))`` (its config's ``scoring_func``), the rest alike.
- Llama 4: top-k of the logits, each chosen expert's *input* multiplied by ``sigmoid(logit)`` (no renormalisation);
  its router hands back those scores as a dense ``(tokens, E)`` matrix, zero where a token did not go.

How: forward hooks on each router module (``gate`` / ``router`` beside an ``experts`` module), installed inside
``recording(model)`` and removed in ``finally``. A hook records only while its own recorder is the one active in the
calling thread (a ``ContextVar``), so two browser sessions running one cached model never mix their routes.
The gate's own outputs give the dispatched experts and weights, exactly as the model used them; the probabilities
over *all* experts are recomputed from the router logits in float32, and which rule (softmax/sigmoid, renormalised
or not, scale) turns them into the dispatched weights is checked on the data, not assumed.

The family (``FAMILY``): ``load`` refuses, naming the architecture, a model without MoE layers or whose routing
it cannot read (a four-token run at load: a router that returns something else, weights no rule explains);
``run(loaded, TextInput)`` returns a frozen ``RoutingResult`` whose ``routing`` the views read (``attention`` is
empty), and ``prompt_pair`` routes two prompts for the two-prompt view (viz/figures/moe.py).
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from models.analysis.routing import token_categories
from models.core import hooks, loading
from models.core import text as text_utils
from models.core.inputs import TextInput
from models.core.loading import LoadedModel, Progress, text_out_of_memory
from models.core.results import RunResult
from models.core.specs import ModelSpec

CAPTURE_DESCRIPTION = "forward hooks on the router modules (dispatch as the model used it; probabilities in float32)"
ROUTER_CHILD_NAMES = ("gate", "router")


# --- the result -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Routing:
    """Every MoE layer's routing for one input (batch item 0), as plain numpy.

    ``probs``: float32 ``(layers, tokens, experts)``, each row sums to 1 (for sigmoid routers: the sigmoid scores
    normalised to sum to 1, so the views can compare families). ``top_experts``: int64 ``(layers, tokens, k)``, the
    experts the model dispatched each token to, highest weight first. ``top_weights``: float32 ``(layers, tokens, k)``,
    the weights it multiplied their outputs by. ``kept``: bool ``(layers, tokens, k)``, False where an expert was full
    (Switch capacity) and the token skipped it. ``shared_weight``: float32 ``(layers, tokens)`` scale of the shared
    expert(s), or None when the family has none.
    """

    tokens: list[str]  # display strings (whitespace and control characters made visible)
    raw_tokens: list[str]  # the text each token covers in the input (special tokens: their name)
    token_ids: list[int]
    layer_names: list[str]  # module path of each router, e.g. "model.layers.3.mlp.gate"
    layer_indices: list[int]  # the transformer block each MoE layer sits in
    probs: np.ndarray
    top_experts: np.ndarray
    top_weights: np.ndarray
    kept: np.ndarray
    score_function: str  # "softmax" or "sigmoid"
    renormalized: bool  # top-k weights divided by their sum before use
    weight_scale: float  # constant factor on the dispatched weights (DeepSeek's routed_scaling_factor), else 1
    shared_weight: np.ndarray | None = None
    num_shared_experts: int = 0
    capacity: int | None = None  # Switch: tokens an expert accepts per sequence
    weights_scale_input: bool = False  # Llama 4: the weight multiplies the expert's input, not its output
    stack: str = "decoder"  # "decoder" (causal LM) or "encoder" (Switch: the encoder reads the text)
    token_offsets: list[tuple[int, int]] | None = None  # character span of each token in the input text
    special_positions: list[int] = field(default_factory=list)  # BOS/EOS and the like
    categories: list[str] = field(default_factory=list)  # word / code / number / punctuation / other per token

    @property
    def num_layers(self) -> int:
        return int(self.probs.shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.probs.shape[2])

    @property
    def top_k(self) -> int:
        return int(self.top_experts.shape[2])

    @property
    def top1(self) -> np.ndarray:
        """int64 ``(layers, tokens)``: the expert with the largest dispatched weight."""
        return self.top_experts[:, :, 0]

    def dispatch_rule(self) -> str:
        """The rule in words, e.g. 'top-2 of softmax, renormalised to sum to 1'."""
        rule = f"top-{self.top_k} of {self.score_function}"
        if self.renormalized:
            rule += ", renormalised to sum to 1"
        if abs(self.weight_scale - 1.0) > 1e-6:
            rule += f", × {self.weight_scale:g}"
        if self.capacity is not None:
            rule += f"; at most {self.capacity} tokens per expert"
        if self.weights_scale_input:
            rule += " (each weight scales the expert's input)"
        if self.num_shared_experts:
            rule += f"; plus {self.num_shared_experts} shared expert(s) every token uses"
        return rule

    def layer_label(self, layer: int) -> str:
        """'block 3' (the transformer block the MoE layer sits in), 'encoder block 3' for encoder-decoders."""
        prefix = "encoder " if self.stack == "encoder" else ""
        return f"{prefix}block {self.layer_indices[layer]}"

    @property
    def layer_labels(self) -> list[str]:
        """``layer_label`` of every MoE layer, in model order: what names the layers on the page and in files."""
        return [self.layer_label(layer) for layer in range(self.num_layers)]

    @property
    def text(self) -> str:
        """The text that was routed (special tokens left out; a truncated input ends where the routing does)."""
        special = set(self.special_positions)
        return "".join(raw for position, raw in enumerate(self.raw_tokens) if position not in special)

    def check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"MoE layer {layer} does not exist: this model has MoE layers 0..{self.num_layers - 1} "
                             f"({', '.join(self.layer_labels)})")

    def check_token(self, position: int) -> None:
        if not 0 <= position < len(self.tokens):
            raise ValueError(f"token {position} does not exist: the input has tokens 0..{len(self.tokens) - 1}")


# --- finding the routers ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RouterSite:
    name: str  # module path of the router
    block_name: str  # module path of the MoE block (parent of router and experts)
    router: torch.nn.Module
    block: torch.nn.Module
    layer_index: int
    stack: str
    shared_gate: torch.nn.Module | None  # Qwen2-MoE's sigmoid gate on the shared expert


def router_sites(model: torch.nn.Module) -> list[RouterSite]:
    """Every router of ``model``: a ``gate``/``router`` child of a module that also has an ``experts`` child."""
    sites = []
    for block_name, block in model.named_modules():
        children = dict(block.named_children())
        if "experts" not in children:
            continue
        for child_name in ROUTER_CHILD_NAMES:
            router = children.get(child_name)
            if router is None:
                continue
            numbers = re.findall(r"\.(\d+)\.", f".{block_name}.")
            stack = "encoder" if re.search(r"(^|\.)encoder\.", block_name) else "decoder"
            sites.append(RouterSite(f"{block_name}.{child_name}", block_name, router, block,
                                    int(numbers[0]) if numbers else len(sites), stack,
                                    children.get("shared_expert_gate")))
            break
    return sites


def is_moe_model(model: torch.nn.Module) -> bool:
    return bool(router_sites(model))


def _model_type(model) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", "") or type(model).__name__)


def no_moe_layers(model, name: str = "") -> str:
    """The refusal of a model in which no router was found, naming its architecture."""
    called = f"'{name}' ({_model_type(model)})" if name else _model_type(model)
    return (f"{called} has no mixture-of-experts layers this page can read: no 'gate' or 'router' module beside an "
            "'experts' module. Pick an MoE model such as Mixtral, OLMoE, Qwen-MoE, DeepSeek or Switch "
            "Transformers; the language-model (GPT) page draws any model's attention.")


# --- recording --------------------------------------------------------------------------------------------------

@dataclass
class RouterCall:
    """One router call: logits ``(tokens, E)`` float32, dispatched ``experts``/``weights`` ``(tokens, k)``."""

    logits: torch.Tensor
    experts: torch.Tensor
    weights: torch.Tensor
    kept: torch.Tensor
    weights_dtype: torch.dtype = torch.float32  # precision the model computed the weights in


@dataclass
class RoutingRecorder:
    """Per-call state: what each router of one forward pass produced (never stored on the model)."""

    sites: list[RouterSite]
    calls: dict[str, list[RouterCall]] = field(default_factory=dict)
    shared: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    model_type: str = "this model"  # config.model_type, named in refusals
    score_functions: tuple[str, ...] = ("softmax", "sigmoid")  # the candidates ``infer_dispatch_rule`` tries

    def record_router(self, site: RouterSite, output) -> None:
        self.calls.setdefault(site.name, []).append(_parse_router_output(site, output, self.model_type))

    def record_shared(self, site: RouterSite, output: torch.Tensor) -> None:
        self.shared.setdefault(site.name, []).append(output.detach().reshape(-1).to("cpu", torch.float32))


def _parse_router_output(site: RouterSite, output, model_type: str = "this model") -> RouterCall:
    """Read the router output conventions of transformers v5 into one ``RouterCall``.

    - top-k routers (Mixtral, OLMoE, Qwen-MoE, DeepSeek, ...): ``(logits (T, E), weights (T, k), indices (T, k))``;
    - Switch's top-1 router: ``(dispatch one-hot (B, S, E) after the capacity cut, max prob (B, S, 1), logits)``;
    - Llama 4's router: ``(scores (T, E), logits (T, E))``, the chosen experts' scores and zeros elsewhere.
    """
    if isinstance(output, tuple) and len(output) == 2 and all(torch.is_tensor(t) and t.is_floating_point()
                                                              for t in output) and output[0].shape == output[1].shape:
        return _dense_scores_call(output[0].detach(), output[1].detach())
    if not (isinstance(output, tuple) and len(output) == 3 and all(torch.is_tensor(t) for t in output)):
        returned = f"{len(output)} values" if isinstance(output, tuple) else \
            "one tensor" if torch.is_tensor(output) else "something else"
        raise ValueError(f"{model_type}'s router ({type(site.router).__name__}, at {site.name}) returns {returned}, "
                         "not the (logits, weights, experts) this page reads, so it cannot say which experts each "
                         "token went to and draws nothing rather than a guess. The language-model (GPT) or "
                         "translation page draws its attention.")
    first, second, third = (t.detach() for t in output)
    if not third.is_floating_point():  # (logits, weights, indices)
        logits = first.reshape(-1, first.shape[-1]).to("cpu", torch.float32)
        experts = third.reshape(logits.shape[0], -1).to("cpu", torch.int64)
        weights = second.reshape(logits.shape[0], -1).to("cpu", torch.float32)
        # highest weight first, so slot 0 is "the" top-1 expert whatever order topk(sorted=False) left
        order = torch.argsort(weights, dim=-1, descending=True, stable=True)
        experts, weights = experts.gather(1, order), weights.gather(1, order)
        return RouterCall(logits, experts, weights, torch.ones_like(experts, dtype=torch.bool), second.dtype)
    if first.is_floating_point() or first.shape != third.shape or second.numel() * third.shape[-1] != \
            third.numel():  # Switch's probability is one per token (NLLB-MoE's router hands a matrix: not read)
        raise ValueError(f"{model_type}'s router ({type(site.router).__name__}, at {site.name}) returns tensors this "
                         "page does not read as (logits, weights, experts) or Switch's (dispatch, probability, "
                         "logits), so it draws no routing rather than a guess. The language-model (GPT) or "
                         "translation page draws its attention.")
    logits = third.reshape(-1, third.shape[-1]).to("cpu", torch.float32)
    dispatch = first.reshape(-1, first.shape[-1]).to("cpu")
    experts = logits.argmax(dim=-1, keepdim=True)  # the router's choice, before the capacity cut
    kept = dispatch.gather(1, experts).bool()
    weights = second.reshape(-1, 1).to("cpu", torch.float32)
    return RouterCall(logits, experts, weights, kept, second.dtype)


def _dense_scores_call(scores: torch.Tensor, logits: torch.Tensor) -> RouterCall:
    """Llama 4's ``(scores, logits)``, each ``(T, E)``: the experts are the non-zero scores, the weights their
    values, highest first."""
    scores = scores.reshape(-1, scores.shape[-1]).to("cpu", torch.float32)
    k = max(1, int((scores > 0).sum(dim=-1).max()))
    weights, experts = scores.topk(k, dim=-1)  # sorted: highest weight first
    return RouterCall(logits.reshape(scores.shape).to("cpu", torch.float32), experts, weights,
                      torch.ones_like(experts, dtype=torch.bool), scores.dtype)


def score_functions(config) -> tuple[str, ...]:
    """The score functions a router of this config may use: softmax, sigmoid, and the config's own
    ``scoring_func`` where it names another (DeepSeek-V4's ``sqrtsoftplus``)."""
    named = getattr(config, "scoring_func", None) if config is not None else None
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else None
    named = named or getattr(text, "scoring_func", None)
    from transformers.activations import ACT2CLS

    extra = (named,) if isinstance(named, str) and named not in ("softmax", "sigmoid") and named in ACT2CLS else ()
    return ("softmax", "sigmoid", *extra)


@contextlib.contextmanager
def recording(model: torch.nn.Module):
    """Record every router call of ``model`` made by this call's forwards inside the ``with`` block; the hooks act
    only for this call (``hooks.installed``), so concurrent runs of the same model are neither recorded here nor
    disturbed."""
    sites = router_sites(model)
    if not sites:
        raise ValueError(no_moe_layers(model))
    config = getattr(model, "config", None)
    recorder = RoutingRecorder(sites, model_type=_model_type(model), score_functions=score_functions(config))

    def router_hook(site):
        def hook(module, args, output):
            recorder.record_router(site, output)
        return hook

    def shared_hook(site):
        def hook(module, args, output):
            recorder.record_shared(site, output)
        return hook

    installed = [hooks.after(site.router, router_hook(site)) for site in sites]
    installed += [hooks.after(site.shared_gate, shared_hook(site)) for site in sites if site.shared_gate is not None]
    with hooks.installed(installed):
        yield recorder


# --- which rule turns logits into the dispatched weights ----------------------------------------------------------

@dataclass(frozen=True)
class DispatchRule:
    score_function: str  # "softmax" or "sigmoid"
    renormalized: bool
    weight_scale: float


def scores_from_logits(logits: torch.Tensor, score_function: str) -> torch.Tensor:
    """float32 per-expert scores ``(T, E)``: softmax over experts, or an independent function of each logit
    (sigmoid; DeepSeek-V4's sqrt(softplus), by the name transformers gives it)."""
    logits = logits.to(torch.float32)
    if score_function == "softmax":
        return torch.softmax(logits, dim=-1)
    if score_function == "sigmoid":
        return torch.sigmoid(logits)
    from transformers.activations import ACT2FN

    return ACT2FN[score_function](logits)


def dispatch_weights(scores: torch.Tensor, experts: torch.Tensor, rule: DispatchRule) -> torch.Tensor:
    """Weights ``(T, k)`` the rule gives the chosen ``experts`` ``(T, k)`` from ``scores`` ``(T, E)``."""
    chosen = scores.gather(1, experts)
    if rule.renormalized:
        chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20)
    return chosen * rule.weight_scale


def infer_dispatch_rule(calls: list[RouterCall], functions: tuple[str, ...] = ("softmax", "sigmoid")
                        ) -> DispatchRule | None:
    """The (score function, renormalisation, constant scale) that reproduces every dispatched weight, or None.

    Rules with scale 1 are preferred; a fitted constant (DeepSeek's ``routed_scaling_factor``) only when none fits.
    The tolerance follows the precision the router's weights came back in (bf16 keeps ~3 significant digits).
    """
    logits = torch.cat([c.logits for c in calls])
    experts = torch.cat([c.experts for c in calls])
    weights = torch.cat([c.weights for c in calls])
    tolerance = max(_relative_precision(c.weights_dtype) for c in calls)
    fitted = []
    for score_function in functions:
        scores = scores_from_logits(logits, score_function)
        for renormalized in (False, True):
            base = dispatch_weights(scores, experts, DispatchRule(score_function, renormalized, 1.0))
            if _max_relative_error(base, weights) <= tolerance:
                return DispatchRule(score_function, renormalized, 1.0)
            scale = float((weights * base).sum() / (base * base).sum().clamp_min(1e-30))
            if scale > 0:
                fitted.append((_max_relative_error(base * scale, weights), score_function, renormalized, scale))
    if fitted:
        error, score_function, renormalized, scale = min(fitted)
        if error <= tolerance:
            return DispatchRule(score_function, renormalized, scale)
    return None


def _relative_precision(dtype: torch.dtype) -> float:
    return {torch.bfloat16: 1e-2, torch.float16: 2e-3}.get(dtype, 1e-4)


def _max_relative_error(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    return float(((estimate - reference).abs() / reference.abs().clamp_min(1e-6)).max())


# --- running ----------------------------------------------------------------------------------------------------

def _token_texts(tokenizer, text: str, ids: list[int], offsets) -> list[str]:
    """What each token covers in the user's text (offsets when the tokenizer has them, else decoded alone)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    texts = []
    for i, token_id in enumerate(ids):
        if token_id in special:
            texts.append(tokenizer.convert_ids_to_tokens(token_id))
        elif offsets is not None and offsets[i][1] > offsets[i][0]:
            texts.append(text[offsets[i][0]:offsets[i][1]])
        else:
            texts.append(tokenizer.decode([token_id]))
    return texts


def _tokenize(tokenizer, text: str, max_tokens: int):
    try:
        encoded = tokenizer(text, return_tensors="pt", return_offsets_mapping=True, truncation=True,
                            max_length=max_tokens)
        offsets = [tuple(int(v) for v in pair) for pair in encoded.pop("offset_mapping")[0].tolist()]
    except (NotImplementedError, TypeError, ValueError):  # slow tokenizers have no offsets
        encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens)
        offsets = None
    return encoded, offsets


@dataclass(frozen=True, kw_only=True)
class RoutingResult(RunResult):
    """An MoE model on one text: where its routers sent every token (``routing``). ``attention`` is empty: the page
    shows routing, not attention."""

    routing: Routing


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = loading._no_progress) -> LoadedModel:
    """An MoE model (Mixtral, OLMoE, Qwen-MoE, Switch, this project's mini) with capture attention; refused with a
    message when it has no mixture-of-experts layers."""
    import transformers

    def auto_class(config):  # Switch Transformers are encoder–decoders: the page routes their encoder
        if getattr(config, "is_encoder_decoder", False):
            return transformers.AutoModelForSeq2SeqLM
        return transformers.AutoModelForCausalLM

    loaded = loading.load_transformers(spec, auto_class, device, dtype, progress)
    if not is_moe_model(loaded.model):
        raise ValueError(no_moe_layers(loaded.model, spec.id))
    progress("Checking how its routers choose (four tokens)", 0.95)
    check_routing(loaded.model)
    return replace(loaded, capture=CAPTURE_DESCRIPTION)


def check_routing(model: torch.nn.Module) -> None:
    """Route four tokens and read them as ``run`` does: a router this page cannot read is refused in words now,
    when the model loads, not after a user's text ran."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(getattr(text, "vocab_size", 0) or getattr(config, "vocab_size", 0) or 8)
    device = next(model.parameters()).device
    ids = (torch.arange(1, 5, device=device) % vocab)[None]
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    with recording(model) as recorder, torch.inference_mode():
        if encoder_decoder:
            model.get_encoder()(input_ids=ids, attention_mask=torch.ones_like(ids))
        else:
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    tokens = [str(i) for i in ids[0].tolist()]
    routing_from_recorder(recorder, tokens, ids[0].tolist(), None, config)


def run(loaded: LoadedModel, inputs: TextInput, options: None = None) -> RoutingResult:
    """Route the text through an MoE model. Causal LMs run whole; encoder-decoders (Switch) run their encoder, the
    part that reads the text. Raises ``ValueError`` for empty text or a token limit below 2."""
    text, max_tokens = inputs.text, inputs.max_tokens
    if not isinstance(text, str) or not text.strip():
        raise ValueError("The text is empty. Type or paste some text, or pick one of the examples.")
    if max_tokens < 2:
        raise ValueError("The token limit must be at least 2.")
    notices = []
    if len(text) > text_utils.MAX_CHARACTERS:
        text = text[:text_utils.MAX_CHARACTERS]
        notices.append(f"Only the first {text_utils.MAX_CHARACTERS:,} characters were read.")
    model, tokenizer = loaded.model, loaded.tokenizer
    encoded, offsets = _tokenize(tokenizer, text, max_tokens)
    input_ids = encoded["input_ids"]
    if input_ids.shape[1] == 0:
        raise ValueError("The text produced no tokens. Type a few words.")
    full_length = len(tokenizer(text, add_special_tokens=True)["input_ids"])
    if full_length > input_ids.shape[1]:
        notices.append(f"The text has {full_length:,} tokens; only the first {input_ids.shape[1]:,} were routed "
                       "(raise the token limit in the sidebar to route more).")
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    device = next(model.parameters()).device
    model_inputs = {k: v.to(device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
    with text_out_of_memory(str(device), input_ids.shape[1]), recording(model) as recorder, \
            torch.inference_mode():
        if encoder_decoder:
            model.get_encoder()(**model_inputs)
        else:
            model(**model_inputs, use_cache=False)
    if encoder_decoder:
        notices.append("This is an encoder–decoder model: the routing shown is its encoder's, which reads your "
                       "text (the decoder routes the tokens it writes).")
    ids = input_ids[0].tolist()
    raw = _token_texts(tokenizer, text, ids, offsets)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special_positions = [i for i, token_id in enumerate(ids) if token_id in special]
    routing = routing_from_recorder(recorder, raw, ids, offsets, model.config, special_positions,
                                    token_categories(text, raw, offsets, set(special_positions)))
    for array in (routing.probs, routing.top_experts, routing.top_weights, routing.kept, routing.shared_weight):
        if array is not None:
            array.setflags(write=False)  # results are cached and shared between sessions: nobody edits them
    if routing.capacity is not None and not routing.kept.all():
        dropped = int((~routing.kept).sum())
        notices.append(f"{dropped} token-layer routes overflowed an expert's capacity ({routing.capacity} tokens) "
                       "and skipped the expert (they pass through the residual only).")
    return RoutingResult(model=loaded.info(), tokens=routing.tokens, attention={}, input_name=inputs.name,
                         notices=tuple(notices), routing=routing)


def routing_from_recorder(recorder: RoutingRecorder, raw_tokens: list[str], token_ids: list[int],
                          offsets, config, special_positions: list[int] | None = None,
                          categories: list[str] | None = None) -> Routing:
    """Stack the recorded router calls (one per MoE layer, in model order) into a ``Routing``.

    ``raw_tokens``: the text each token covers; ``offsets``: their character spans (or None).
    """
    tokens = [text_utils.display_token(t) for t in raw_tokens]
    sites = [s for s in recorder.sites if s.name in recorder.calls]
    if not sites:
        where = " (its encoder, which reads the text, has none)" if any(
            s.stack == "decoder" for s in recorder.sites) and getattr(config, "is_encoder_decoder", False) else ""
        raise ValueError(f"No router of {recorder.model_type} ran for this input{where}: its MoE layers were "
                         "skipped, so there is no routing to show. The language-model (GPT) or translation page "
                         "draws its attention.")
    if len({s.stack for s in sites}) > 1:
        sites = [s for s in sites if s.stack == "encoder"]
    calls = [recorder.calls[s.name][-1] for s in sites]  # the last call per router is this input's
    rule = infer_dispatch_rule(calls, recorder.score_functions)
    if rule is None:
        raise ValueError(f"{recorder.model_type}'s router turns its logits into weights in a way this page does not "
                         f"recognise (top-k of {' or '.join(recorder.score_functions)}, renormalised or not, times "
                         "a constant), so the probabilities it would show could not be the model's. It draws no "
                         "routing rather than a wrong one; the language-model (GPT) page draws its attention.")
    probs = []
    for call in calls:
        scores = scores_from_logits(call.logits, rule.score_function)
        probs.append((scores / scores.sum(dim=-1, keepdim=True)).numpy())
    shared = None
    if any(s.name in recorder.shared for s in sites):
        shared = np.stack([torch.sigmoid(recorder.shared[s.name][-1]).numpy() if s.name in recorder.shared
                           else np.ones(len(tokens), np.float32) for s in sites])
    num_shared = int(getattr(config, "n_shared_experts", 0) or 0)
    if shared is not None:
        num_shared = max(num_shared, 1)
    elif num_shared:
        shared = np.ones((len(sites), len(tokens)), np.float32)  # DeepSeek: shared experts always on, weight 1
    capacity = getattr(config, "expert_capacity", None) if any(
        "Top1Router" in type(s.router).__name__ for s in sites) else None
    return Routing(
        tokens=tokens, raw_tokens=list(raw_tokens), token_ids=token_ids, layer_names=[s.name for s in sites],
        layer_indices=[s.layer_index for s in sites],
        probs=np.stack(probs).astype(np.float32),
        top_experts=np.stack([c.experts.numpy() for c in calls]),
        top_weights=np.stack([c.weights.numpy() for c in calls]).astype(np.float32),
        kept=np.stack([c.kept.numpy() for c in calls]),
        score_function=rule.score_function, renormalized=rule.renormalized, weight_scale=rule.weight_scale,
        shared_weight=shared, num_shared_experts=num_shared, capacity=capacity, stack=sites[0].stack,
        weights_scale_input=_weights_scale_input(config),
        token_offsets=offsets, special_positions=list(special_positions or []), categories=list(categories or []),
    )


def _weights_scale_input(config) -> bool:
    """Whether the architecture multiplies each chosen expert's input, not its output, by its weight (Llama 4)."""
    return str(getattr(config, "model_type", "")).startswith("llama4")


# --- two prompts ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptPair:
    """One model's routing of two prompts, A and B: what the "two prompts" view compares."""

    a: RoutingResult
    b: RoutingResult

    def __post_init__(self):
        if self.a.model != self.b.model or self.a.routing.layer_names != self.b.routing.layer_names:
            raise ValueError("the two prompts must be routed by the same model")


def prompt_pair(loaded: LoadedModel, result: RoutingResult | None, options) -> PromptPair:
    """The two-prompt view's analysis: ``options.prompt_a`` and ``options.prompt_b`` routed by ``loaded`` (cut to
    ``options.max_tokens``). ``result`` (the page's own text) is not used. The page builds the pair from its cached
    runs instead; the command line comes here."""
    return PromptPair(*(run(loaded, TextInput(prompt, options.max_tokens))
                        for prompt in (options.prompt_a, options.prompt_b)))


# The page's sample texts: the first is what it opens with (and the command line's default text).
SAMPLES = {
    # prose, code and numbers in the mini's own vocabulary (its generator's words, models/minis/moe/data.py), so
    # the coloured text shows each kind of token going to its own experts (word, code and number tokens route
    # apart well beyond shuffled routing); plain prose alone shows little of that
    "Mixed": "Anna found the old map in the kitchen. Later, she counted 12 boats by the river.\n\n"
             "def count_prices(prices, total):\n    for item in prices:\n        total = total + item\n"
             "    return total\n\n2024-03-15 17.25 381\n12 + 30 = 42",
    "Prose": "The old man walked slowly to the harbour in the morning. He was glad that the boats had returned "
             "before the storm, and he counted 12 of them.",
    "Code": "def average(values):\n    total = sum(values)\n    if len(values) == 0:\n        return 0\n"
            "    return total / len(values)",
    "Numbers": "3 + 4 = 7\n12 * 7 = 84\n2, 4, 6, 8, 10, 12\n2024-03-15 17.25 381",
}


def per_category(counts: dict[str, int]) -> str:
    """Tokens per category as a sentence reads them: "word 17, code 28, number 18, punctuation 8"."""
    return ", ".join(f"{category} {count:,}" for category, count in counts.items())
