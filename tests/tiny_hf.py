"""Tiny, randomly initialised Hugging Face models the tests build and save locally (nothing is downloaded):
a BERT (text tower), a causal LM with a chat template (noun-phrase extraction), and a vision-encoder-decoder
with an image processor (recaptioning). Their outputs are nonsense; the tests check shapes, batching,
resume, fallbacks and formats — the code paths real models take."""

from __future__ import annotations

from pathlib import Path

WORDS = ("a an the and of on in is left right above below red green blue yellow circle square triangle cross "
         "small large white gray black background there are objects picture image photo shape with").split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
# A chat template in the usual form (role turns, then the assistant's prompt), small enough to read.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def _word_tokenizer(special: list[str], **tokens):
    """A fast tokenizer over WORDS (whitespace and punctuation split, unknown words → [UNK])."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate([*special, *WORDS, ".", ",", ":", "-", "\n"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", **tokens), len(vocab)


def tiny_bert(folder: Path) -> Path:
    """A 2-layer BERT (width 32) and its word-level tokenizer, saved to ``folder``."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join([*SPECIAL, *WORDS, ".", ","]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_causal_lm(folder: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 (width 32) with a word-level tokenizer and a chat template, saved to ``folder``; its random
    weights come from ``seed``, so what it generates is the same on every run."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    tokenizer, size = _word_tokenizer(SPECIAL, pad_token="[PAD]", eos_token="</s>", bos_token="<s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = GPT2Config(vocab_size=size, n_embd=32, n_layer=2, n_head=2, n_positions=256,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_image_captioner(folder: Path, image_size: int = 32) -> Path:
    """A vision-encoder-decoder (2-layer ViT encoder, 2-layer GPT-2 decoder with cross-attention) with a ViT
    image processor and a word-level tokenizer, saved to ``folder`` as BLIP-style captioners are."""
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig, ViTImageProcessor

    tokenizer, size = _word_tokenizer(SPECIAL, pad_token="[PAD]", eos_token="</s>", bos_token="<s>")
    encoder = ViTConfig(image_size=image_size, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)
    decoder = GPT2Config(vocab_size=size, n_embd=32, n_layer=2, n_head=2, n_positions=64, add_cross_attention=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    model = VisionEncoderDecoderModel(config=config)
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
