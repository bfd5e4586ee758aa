"""Tiny random text models saved to a folder and loaded through the app's real loader (models.families.load).

Used by the hostile-input, concurrency and fault tests: a Llama-style causal LM (RoPE, 4 query heads sharing 2
key/value heads, like SmolLM2) with a byte-level BPE tokenizer (every string is encodable, as with GPT-2/SmolLM2),
and a BERT encoder with a WordPiece tokenizer (lower-casing, accent stripping, [CLS]/[SEP], like MiniLM). Both are a
few hundred kB and load in well under a second.
"""
from __future__ import annotations

from pathlib import Path

import torch

from models import families
from models.core import loading
from models.core.specs import ModelSpec

CORPUS = ["the cat sat on the mat. the dog sat on the log.", "a quick brown fox jumps over the lazy dog!",
          "def add(a, b):\n    return a + b", "one two three four five six seven eight nine ten"] * 25
EOS = "<|endoftext|>"


def byte_level_tokenizer():
    """GPT-2-style byte-level BPE: any Unicode string is encodable (unknown bytes are single-byte tokens)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, unk_token=EOS,
                                   pad_token=EOS, model_max_length=128)


def wordpiece_tokenizer():
    """BERT-style WordPiece with [CLS] … [SEP]; unknown words become [UNK]."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials,
                                                                    show_progress=False))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                             special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]", model_max_length=128)


def save_tiny_causal_lm(folder: Path, seed: int = 0, positions: int = 64) -> Path:
    """A 2-layer Llama (4 query heads, 2 key/value heads, ``positions`` positions) and its tokenizer, saved to
    ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_level_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_tiny_encoder(folder: Path, seed: int = 0) -> Path:
    """A 2-layer BERT (4 heads, 64 positions) and its WordPiece tokenizer, saved to ``folder``."""
    from transformers import BertConfig, BertModel

    tokenizer = wordpiece_tokenizer()
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_local(family: str, folder: Path) -> loading.LoadedModel:
    """Load ``folder`` exactly as a user-typed local folder is loaded (the folder must be allowed)."""
    return families.load(ModelSpec(family, str(folder), "local", str(folder), "test", "random weights"))
