"""The C2LIP method core: token features, concept embeddings, loss formulas, de-duplication,
chunking, and distributed correctness (2 gloo processes against one process on the same batch)."""

import os

import open_clip
import pytest
import torch
import torch.nn.functional as F
from conftest import free_port, spawn_ranks

from components.method import models
from components.method.batches import concept_batch
from components.method.losses import (
    C2LIPLoss,
    npc_loss,
    sigmoid_contrastive,
    softmax_contrastive,
    text_ids,
    xac_loss,
)
from components.method.models import TINY_CLIP, TINY_RN, TINY_SIGLIP, create_model, image_features_and_tokens
from components.method.module import TrainingModule

PHRASES = [
    ["a large red circle", "a small blue square"],
    ["a small blue square"],
    ["a green cross", "the green cross", "a large red circle"],
    [],
    ["a yellow triangle"],
    ["a large red circle", "a yellow triangle"],
]


def _model(name, seed=0):
    torch.manual_seed(seed)
    model, _, _, tokenizer = create_model(name)
    return model, tokenizer


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    """Equal within ``tol`` of the tensor's scale (fp32 sums in another order differ by ~1e-7 relative)."""
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


def _images(n=6, seed=1):
    return torch.randn(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------------
# models and token features
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [TINY_SIGLIP, TINY_CLIP, TINY_RN])
def test_tiny_configs_are_open_clip_models_with_1d_logit_scale(name):
    model, tokenizer = _model(name)
    assert name in open_clip.list_models()
    assert model.logit_scale.shape == (1,)
    assert (model.logit_bias is not None) == (name != TINY_CLIP)
    assert tokenizer(["a red circle"]).shape == (1, 64 if name == TINY_RN else 77)


@pytest.mark.parametrize("name", [TINY_SIGLIP, TINY_CLIP])
def test_token_path_adds_nothing_and_pooled_equals_encode_image(name):
    model, _ = _model(name)
    model.eval()
    images = _images()
    keys, count = list(model.state_dict()), sum(p.numel() for p in model.parameters())
    before = model.encode_image(images)
    pooled, tokens = image_features_and_tokens(model, images)
    assert torch.equal(pooled, before)
    assert tokens.shape == (6, 64, 128)  # 64 patches of 8 px, joint width 128
    assert torch.equal(model.encode_image(images), before)
    assert list(model.state_dict()) == keys and sum(p.numel() for p in model.parameters()) == count
    module = TrainingModule(model, C2LIPLoss())
    assert sum(p.numel() for p in module.parameters()) == count  # the method adds no parameter


def test_map_token_features_are_what_the_head_outputs_for_a_single_token():
    model, _ = _model(TINY_SIGLIP)
    model.eval()
    trunk = model.visual.trunk
    x = trunk.forward_features(_images(2))
    same = x[:, :1].expand(-1, x.shape[1], -1).contiguous()  # every token identical
    # attention over identical values returns that value: the pooled output is the token feature
    pooled = trunk.attn_pool(same)
    per_token = models._map_token_features(trunk.attn_pool, same)
    torch.testing.assert_close(per_token[:, 0], pooled, rtol=1e-5, atol=1e-5)
    # and the value half of kv is the second half of its output channels
    C = x.shape[-1]
    v = F.linear(x, trunk.attn_pool.kv.weight[C:], trunk.attn_pool.kv.bias[C:])
    u = trunk.attn_pool.proj(v)
    torch.testing.assert_close(models._map_token_features(trunk.attn_pool, x), u + trunk.attn_pool.mlp(trunk.attn_pool.norm(u)), rtol=1e-5, atol=1e-5)


def test_cls_token_features_are_ln_post_then_proj_of_patch_tokens():
    model, _ = _model(TINY_CLIP)
    model.eval()
    seen = {}
    handle = model.visual.transformer.register_forward_hook(lambda m, i, o: seen.setdefault("x", o))
    pooled, tokens = image_features_and_tokens(model, _images(2))
    handle.remove()
    x = seen["x"]
    torch.testing.assert_close(tokens, model.visual.ln_post(x[:, 1:]) @ model.visual.proj, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pooled, model.visual.ln_post(x[:, 0]) @ model.visual.proj, rtol=1e-5, atol=1e-5)


def test_inference_never_takes_the_token_path(monkeypatch):
    model, tokenizer = _model(TINY_SIGLIP)
    calls = []
    monkeypatch.setattr(models, "_map_token_features", lambda *a: calls.append(1))
    model.encode_image(_images(2))
    model(_images(2), tokenizer(["a", "b"]))
    assert calls == []


def test_checkpoint_with_0dim_logit_scale_loads_into_1d_model(tmp_path):
    torch.manual_seed(0)
    plain = open_clip.create_model(TINY_SIGLIP, nonscalar_logit_scale=False)
    with torch.no_grad():
        plain.logit_scale.fill_(3.0)
        plain.logit_bias.fill_(-7.0)
    assert plain.logit_scale.ndim == 0
    path = tmp_path / "scalar.pt"
    torch.save(plain.state_dict(), path)
    model, _, _, _ = create_model(TINY_SIGLIP, pretrained=str(path))
    assert model.logit_scale.shape == (1,) and model.logit_scale.item() == 3.0 and model.logit_bias.item() == -7.0
    images = _images(2)
    torch.testing.assert_close(model.encode_image(images), plain.encode_image(images), rtol=1e-5, atol=1e-5)


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="not an open_clip architecture"):
        create_model("c2lip-huge-nonexistent")


# --------------------------------------------------------------------------------------------------
# concept batches and loss formulas
# --------------------------------------------------------------------------------------------------


def test_concept_batch_deduplicates_and_keeps_owners():
    _, tokenizer = _model(TINY_SIGLIP)
    batch = concept_batch(PHRASES, tokenizer)
    distinct = ["a large red circle", "a small blue square", "a green cross", "the green cross", "a yellow triangle"]
    assert torch.equal(batch["phrase_tokens"], tokenizer(distinct))
    assert batch["phrase_inverse"].tolist() == [0, 1, 1, 2, 3, 0, 4, 0, 4]
    assert batch["phrase_image_index"].tolist() == [0, 0, 1, 2, 2, 2, 4, 5, 5]


def _random_features(seed, B=6, K=9, J=16, D=32):
    g = torch.Generator().manual_seed(seed)
    image = F.normalize(torch.randn(B, D, generator=g), dim=-1).requires_grad_()
    text = F.normalize(torch.randn(B, D, generator=g), dim=-1).requires_grad_()
    phrases = F.normalize(torch.randn(K, D, generator=g), dim=-1).requires_grad_()
    tokens = F.normalize(torch.randn(B, J, D, generator=g), dim=-1).requires_grad_()
    owner = torch.randint(0, B, (K,), generator=g)
    scale = torch.tensor([10.0], requires_grad=True)
    bias = torch.tensor([-5.0], requires_grad=True)
    return image, text, phrases, tokens, owner, scale, bias


def test_sigmoid_and_npc_losses_match_the_formulas():
    image, text, phrases, _, owner, s, b = _random_features(0)
    expected_sig = sum(
        -F.logsigmoid((1 if i == j else -1) * (s * image[i] @ text[j] + b)) for i in range(6) for j in range(6)
    ) / 6
    torch.testing.assert_close(sigmoid_contrastive(image, text, s, b), expected_sig.squeeze(), rtol=1e-5, atol=1e-5)
    expected_npc = sum(
        -F.logsigmoid((1 if owner[k] == i else -1) * (s * image[i] @ phrases[k] + b)) for i in range(6) for k in range(9)
    ) / 9
    torch.testing.assert_close(npc_loss(image, phrases, owner, s, b), expected_npc.squeeze(), rtol=1e-5, atol=1e-5)


def test_text_labels_make_a_repeated_phrase_positive_for_every_image_that_has_it():
    image, _, phrases, tokens, owner, s, b = _random_features(3)
    ids = torch.tensor([0, 1, 0, 2, 1, 3, 0, 4, 2])  # phrases 0, 2, 6 share a text, as do 1 and 4, 3 and 8
    phrases = phrases.detach()[ids].requires_grad_()  # equal text, equal embedding
    has = {(int(owner[k]), int(ids[k])) for k in range(9)}
    label = [[1.0 if (i, int(ids[k])) in has else -1.0 for k in range(9)] for i in range(6)]
    expected_npc = sum(-F.logsigmoid(label[i][k] * (s * image[i] @ phrases[k] + b)) for i in range(6) for k in range(9)) / 9
    torch.testing.assert_close(npc_loss(image, phrases, owner, s, b, ids), expected_npc.squeeze(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(npc_loss(image, phrases, owner, s, b), expected_npc, atol=1e-3)  # occurrence labels differ here
    expected_xac = 0.0
    for k in range(9):
        for m in range(6):
            a = torch.softmax(tokens[m] @ phrases[k], dim=0)
            v = F.normalize((a[:, None] * tokens[m]).sum(0), dim=0)
            expected_xac = expected_xac - F.logsigmoid(label[m][k] * (s * v @ phrases[k] + b))
    torch.testing.assert_close(xac_loss(tokens, phrases, owner, s, b, 1.0, 4, ids), (expected_xac / 9).squeeze(), rtol=1e-5, atol=1e-5)
    # all texts distinct: text labels are occurrence labels
    distinct = torch.arange(9)
    torch.testing.assert_close(npc_loss(image, phrases, owner, s, b, distinct), npc_loss(image, phrases, owner, s, b), rtol=1e-5, atol=1e-5)
    assert text_ids(torch.tensor([[5, 1], [7, 2], [5, 1]])).tolist() in ([0, 1, 0], [1, 0, 1])


def test_softmax_loss_ignores_the_bias_but_gives_it_a_gradient():
    image, text, _, _, _, s, b = _random_features(1)
    with_bias = softmax_contrastive(image, text, s, b)
    without = softmax_contrastive(image, text, s, None)
    torch.testing.assert_close(with_bias, without, rtol=1e-5, atol=1e-5)
    with_bias.backward()
    assert b.grad is not None and b.grad.abs().item() < 1e-5


def _xac_loop(tokens, phrases, owner, s, b, temperature=1.0):
    """Reference: a plain loop over phrases, straight from the formula."""
    total = 0.0
    for k in range(phrases.shape[0]):
        c = phrases[k]
        for m in range(tokens.shape[0]):
            a = torch.softmax(tokens[m] @ c / temperature, dim=0)
            v = F.normalize((a[:, None] * tokens[m]).sum(0), dim=0)
            y = 1.0 if owner[k] == m else -1.0
            total = total - F.logsigmoid(y * (s * v @ c + b))
    return total / phrases.shape[0]


@pytest.mark.parametrize("chunk, temperature", [(256, 1.0), (4, 1.0), (2, 0.07)])
def test_xac_loss_and_gradients_match_a_per_phrase_loop(chunk, temperature):
    _, _, phrases, tokens, owner, s, b = _random_features(2)
    inputs = [tokens, phrases, s, b]
    fast = xac_loss(tokens, phrases, owner, s, b, temperature, chunk)
    grads_fast = torch.autograd.grad(fast, inputs)
    slow = _xac_loop(tokens, phrases, owner, s, b, temperature)
    grads_slow = torch.autograd.grad(slow, inputs)
    torch.testing.assert_close(fast, slow.reshape(fast.shape), rtol=1e-5, atol=1e-5)
    for gf, gs in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(gf, gs, rtol=1e-5, atol=1e-5)


def test_xac_keeps_its_precision_when_a_phrases_attended_tokens_nearly_cancel():
    """Pairs of opposite tokens (u and −u + δ): a phrase orthogonal to them attends evenly, so the pooled
    vector v = Σ a_j u_j is tiny (|v| ≈ 1e-3). With its norm taken as sqrt(aᵀ U Uᵀ a) the fp32 loss was off
    a float64 reference by 1.7e-4 relative here (1e-2 at |v| ≈ 3e-4); taken of v itself, by 8e-9 (bench/losses.py)."""
    g = torch.Generator().manual_seed(0)
    D, pairs = 32, 8
    base = F.normalize(torch.randn(pairs, D, generator=g, dtype=torch.float64), dim=-1)
    nudge = 1e-3 * torch.randn(pairs, D, generator=g, dtype=torch.float64)
    tokens64 = torch.cat([base, -base + nudge])[None].repeat(2, 1, 1)  # [M=2, J=16, D]
    phrase = torch.randn(1, D, generator=g, dtype=torch.float64)
    phrase = F.normalize(phrase - (phrase @ base.T) @ torch.linalg.pinv(base.T), dim=-1)  # ⟂ every base token
    pooled = torch.softmax(tokens64[0] @ phrase[0], 0) @ tokens64[0]
    assert 1e-4 < pooled.norm() < 2e-3  # the regime the old formula broke in
    owner, s, b = torch.tensor([0]), torch.tensor([10.0], dtype=torch.float64), torch.tensor([-5.0], dtype=torch.float64)
    reference = xac_loss(tokens64, phrase, owner, s, b)
    fp32 = xac_loss(tokens64.float(), phrase.float(), owner, s.float(), b.float())
    assert abs(fp32.double() - reference) / reference.abs() < 1e-5


def test_concept_losses_on_bf16_features_agree_with_fp32():
    """A bf16 tower hands the concept losses bf16 features; the losses compute in fp32, so the only
    difference is the features' rounding: loss within 1e-2 relative, gradients at cosine ≥ 0.999."""
    _, _, phrases, tokens, owner, s, b = _random_features(3, B=8, K=20, J=49, D=64)
    image = F.normalize(tokens.detach().mean(1), dim=-1).requires_grad_()
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (image, phrases, tokens)]
        npc = npc_loss(leaves[0], leaves[1], owner, s.detach(), b.detach())
        xac = xac_loss(leaves[2], leaves[1], owner, s.detach(), b.detach(), 1.0, 7)  # the chunked path too
        assert npc.dtype == xac.dtype == torch.float32
        grads = torch.autograd.grad(npc + xac, leaves)
        results[dtype] = (npc.item(), xac.item(), [gr.float().flatten() for gr in grads])
    (n32, x32, g32), (n16, x16, g16) = results[torch.float32], results[torch.bfloat16]
    assert abs(n16 - n32) / n32 < 1e-2 and abs(x16 - x32) / x32 < 1e-2
    for a, c in zip(g32, g16, strict=True):
        assert F.cosine_similarity(a, c, dim=0) >= 0.999


def test_trim_padding_keeps_one_padding_column_rounded_to_eight():
    tokens = torch.zeros(3, 64, dtype=torch.long)
    tokens[0, :5], tokens[1, :9], tokens[2, :2] = 7, 7, 7
    assert models.trim_padding(tokens).shape == (3, 16)  # longest 9, + one padding column, rounded up to 8
    tokens[1, :16] = 7
    assert models.trim_padding(tokens).shape == (3, 24)  # 16 used: the 17th column must stay padding
    full = tokens.clone()
    full[:, -1] = torch.tensor([1, 2, 3])  # no common padding value in the last column: nothing is cut
    assert models.trim_padding(full).shape == (3, 64)
    assert models.trim_padding(torch.zeros(0, 64, dtype=torch.long)).shape == (0, 64)


def _phrase_grads(model, tokens):
    model.zero_grad()
    features = models.encode_concepts(model, tokens)
    (features * torch.linspace(-1, 1, features.shape[1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return features.detach(), grads


def test_trimmed_phrases_equal_padded_ones_where_the_tower_is_causal_and_pools_at_eot():
    """CLIP's text tower (causal mask, argmax pooling): phrases encoded at their own length have the
    embeddings and gradients they have padded to the context, so method.phrase_context 'auto' trims them.
    A SigLIP-like tower (no causal mask: tokens see the padding) gets other embeddings, so 'auto' does not."""
    texts = list(dict.fromkeys(p for phrases in PHRASES for p in phrases))
    model, tokenizer = _model(TINY_CLIP)
    padded = tokenizer(texts)
    trimmed = concept_batch([texts], tokenizer, trim=True)["phrase_tokens"]
    assert torch.equal(trimmed, padded[:, :trimmed.shape[1]])
    assert trimmed.shape[1] == 8 < padded.shape[1] == models.text_context_length(model) == 77
    assert models.trimming_is_exact(model)
    f_full, g_full = _phrase_grads(model, padded)
    f_trim, g_trim = _phrase_grads(model, trimmed)
    torch.testing.assert_close(f_full, f_trim, rtol=1e-5, atol=1e-5)
    assert g_full.keys() == g_trim.keys() and "positional_embedding" in g_trim
    for name in g_full:
        torch.testing.assert_close(g_full[name], g_trim[name], rtol=1e-4, atol=1e-5, msg=str(name))
    siglip_like, tokenizer = _model(TINY_RN)  # no causal mask, as SigLIP's
    assert not models.trimming_is_exact(siglip_like)
    assert [models.trims_phrases(c, model) for c in ("auto", "context", "trimmed")] == [True, False, True]
    assert [models.trims_phrases(c, siglip_like) for c in ("auto", "context", "trimmed")] == [False, False, True]
    full = models.encode_concepts(siglip_like, tokenizer(texts))
    cut = models.encode_concepts(siglip_like, concept_batch([texts], tokenizer, trim=True)["phrase_tokens"])
    assert (full - cut).abs().max() > 1e-3


def test_c2lip_loss_with_trimmed_phrases_and_text_labels_equals_the_padded_one():
    model, tokenizer = _model(TINY_CLIP)
    loss = C2LIPLoss(contrastive="softmax", lambda_xac=0.5, concept_labels="text", concept_logit="own",
                     init_logit_scale=2.0, init_logit_bias=-5.0)
    module = TrainingModule(model, loss)
    images, texts = _images(), tokenizer(["a caption"] * 6)
    with torch.no_grad():
        padded = module(images, texts, **concept_batch(PHRASES, tokenizer))
        trimmed = module(images, texts, **concept_batch(PHRASES, tokenizer, trim=True))
    for key in padded:
        torch.testing.assert_close(padded[key], trimmed[key], rtol=1e-5, atol=1e-5, msg=str(key))


def _loss_and_grads(module, images, texts, batch):
    module.zero_grad()
    terms = module(images, texts, **batch)
    total = sum(terms.values())
    total.backward()
    return total.detach(), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def test_deduplicated_phrases_give_the_same_loss_and_gradients():
    model, tokenizer = _model(TINY_SIGLIP)
    module = TrainingModule(model, C2LIPLoss(lambda_xac=0.5))
    images, texts = _images(), tokenizer([f"caption {i}" for i in range(6)])
    dedup = concept_batch(PHRASES, tokenizer)
    every = {
        "phrase_tokens": tokenizer([p for ps in PHRASES for p in ps]),
        "phrase_inverse": None,
        "phrase_image_index": dedup["phrase_image_index"],
    }
    loss_a, grads_a = _loss_and_grads(module, images, texts, dedup)
    loss_b, grads_b = _loss_and_grads(module, images, texts, every)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-5)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == len(list(module.parameters()))
    for name in grads_a:
        assert _close(grads_a[name], grads_b[name]), (name, (grads_a[name] - grads_b[name]).abs().max())


def test_frozen_phrases_leave_the_text_tower_to_the_contrastive_term():
    model, tokenizer = _model(TINY_SIGLIP)
    images, texts = _images(), tokenizer([f"caption {i}" for i in range(6)])
    grads = {}
    for frozen in (False, True):
        module = TrainingModule(model, C2LIPLoss(lambda_xac=0.5, concept_text_grad=not frozen))
        module.zero_grad()
        terms = module(images, texts, **concept_batch(PHRASES, tokenizer))
        (terms["npc_loss"] + terms["xac_loss"]).backward()  # the concept terms alone
        grads[frozen] = {n: None if p.grad is None else p.grad.abs().sum().item() for n, p in model.named_parameters()}
    text = [n for n in grads[True] if n.startswith("text.")]  # TINY_SIGLIP: a timm image tower, a custom text tower
    image = [n for n in grads[True] if n.startswith("visual.")]
    assert text and image
    assert all(not grads[True][n] for n in text) and any(grads[False][n] for n in text)  # frozen: no text-tower gradient
    assert any(grads[True][n] for n in image)  # the image tower still learns from the concept terms


def test_own_concept_logit_pair_starts_from_the_model_and_learns():
    model, tokenizer = _model(TINY_CLIP)  # no logit bias: the concept terms need their own pair
    with pytest.raises(ValueError, match="concept_logit='own'"):
        TrainingModule(model, C2LIPLoss(contrastive="softmax"))(_images(), tokenizer(["x"] * 6), **concept_batch(PHRASES, tokenizer))
    loss = C2LIPLoss(contrastive="softmax", concept_logit="own", init_logit_scale=model.logit_scale.item(), init_logit_bias=-10.0)
    module = TrainingModule(model, loss)
    assert loss.concept_logit_scale.item() == pytest.approx(model.logit_scale.item())
    _, grads = _loss_and_grads(module, _images(), tokenizer(["x"] * 6), concept_batch(PHRASES, tokenizer))
    assert "loss.concept_logit_scale" in grads and "loss.concept_logit_bias" in grads
    assert len(grads) == len(list(module.parameters()))


def test_siglip_method_skips_the_concept_terms():
    model, tokenizer = _model(TINY_SIGLIP)
    terms = TrainingModule(model, C2LIPLoss(lambda_npc=0, lambda_xac=0))(_images(), tokenizer(["x"] * 6))
    assert list(terms) == ["contrastive_loss"]


# --------------------------------------------------------------------------------------------------
# distributed: 2 gloo processes against one process on the same global batch
# --------------------------------------------------------------------------------------------------


def _make(name, seed=0):
    model, tokenizer = _model(name, seed)
    if name == TINY_SIGLIP:
        loss = C2LIPLoss(lambda_xac=0.5, xac_chunk=3)
    else:
        # text labels: "a large red circle" is image 0's (rank 0) and image 5's (rank 1), so the ranks must agree on ids
        loss = C2LIPLoss(contrastive="softmax", lambda_xac=0.5, concept_logit="own", init_logit_scale=2.0, init_logit_bias=-5.0,
                         concept_labels="text")
    return TrainingModule(model, loss), tokenizer


def _worker(rank, world, port, name, out_dir, batch_norm_frozen=False):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    if name == TINY_RN:  # BatchNorm: also the training mode's figures, for the next test
        _one_rank_step(rank, name, out_dir, False, "-batch-norm-training")
    _one_rank_step(rank, name, out_dir, batch_norm_frozen)
    torch.distributed.destroy_process_group()


def _one_rank_step(rank, name, out_dir, batch_norm_frozen, suffix=""):
    module, tokenizer = _make(name)
    if batch_norm_frozen:  # normalise by the running statistics (eval mode) rather than by the micro-batch's
        _freeze_batch_norm(module)
    ddp = torch.nn.parallel.DistributedDataParallel(module)
    images, texts = _images(), tokenizer([f"caption {i}" for i in range(6)])
    half = slice(rank * 3, rank * 3 + 3)  # rank 0: images 0-2 (5 phrases), rank 1: 3-5 (3 phrases)
    batch = concept_batch(PHRASES[half], tokenizer)
    terms = ddp(images[half], texts[half], **batch)
    total = sum(terms.values())
    total.backward()  # DDP averages the gradients over the ranks: what the optimizer sees
    grads = {n.removeprefix("module."): p.grad for n, p in ddp.named_parameters() if p.grad is not None}
    torch.save({"loss": total.detach(), "grads": grads}, os.path.join(out_dir, f"rank{rank}{suffix}.pt"))


def _freeze_batch_norm(module):
    for layer in module.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            layer.eval()


@pytest.mark.parametrize("name, batch_norm_frozen", [(TINY_SIGLIP, False), (TINY_CLIP, False), (TINY_RN, True)])
def test_two_processes_match_one_process_on_the_global_batch(tmp_path, name, batch_norm_frozen):
    """LayerNorm towers (the ViTs): 2 ranks compute what 1 process computes. The default ResNet does too once its
    BatchNorm layers normalise by running statistics; in training mode BatchNorm normalises by each rank's micro-batch,
    which only SyncBatchNorm (GPUs; the train stage converts) makes global: there the ranks differ from one process."""
    spawn_ranks(_worker, (2, free_port(), name, str(tmp_path), batch_norm_frozen), 2)
    module, tokenizer = _make(name)
    if batch_norm_frozen:
        _freeze_batch_norm(module)
    loss, grads = _loss_and_grads(module, _images(), tokenizer([f"caption {i}" for i in range(6)]), concept_batch(PHRASES, tokenizer))
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(result["loss"], loss, rtol=1e-5, atol=1e-5, msg=str((rank, result["loss"], loss)))
        assert result["grads"].keys() == grads.keys() and len(grads) == len(list(module.parameters()))
        for n, g in grads.items():
            assert _close(result["grads"][n], g), (rank, n, (result["grads"][n] - g).abs().max())


    if name == TINY_RN:
        # what the train stage's warning says on CPU: in training mode, per-rank BatchNorm statistics change the loss (gloo
        # has no SyncBatchNorm); should this start to hold, the warning and docs/gpus.md are wrong
        module, tokenizer = _make(TINY_RN)
        loss, _ = _loss_and_grads(module, _images(), tokenizer([f"caption {i}" for i in range(6)]), concept_batch(PHRASES, tokenizer))
        result = torch.load(tmp_path / "rank0-batch-norm-training.pt")
        assert abs(float(result["loss"]) - float(loss)) > 1e-3 * abs(float(loss))


def test_a_batch_without_phrases_has_zero_concept_terms_and_still_trains():
    model, tokenizer = _model(TINY_SIGLIP)
    terms = TrainingModule(model, C2LIPLoss())(_images(2), tokenizer(["a", "b"]), **concept_batch([[], []], tokenizer))
    assert terms["npc_loss"].item() == 0 and terms["xac_loss"].item() == 0
    sum(terms.values()).backward()
    assert model.logit_bias.grad is not None


def test_resnet_attnpool_token_features_are_what_the_pool_outputs_for_a_single_position():
    model, _ = _model(TINY_RN)
    model.eval()
    visual = model.visual
    x = visual.layer4(visual.layer3(visual.layer2(visual.layer1(visual.stem(_images(2))))))
    pool = visual.attnpool
    same = x[:, :, :1, :1].expand_as(x).contiguous()  # every position holds the same feature
    with torch.no_grad():
        pool.positional_embedding[:] = pool.positional_embedding[1:2].clone()  # and the same position code
    # attention over identical keys and values returns that value: the pooled vector is the token feature
    torch.testing.assert_close(models._attnpool_token_features(pool, same)[:, 0], pool(same), rtol=1e-5, atol=1e-5)
    pooled, tokens = image_features_and_tokens(model, _images(2))
    assert torch.equal(pooled, model.encode_image(_images(2)))
    side = model.visual.image_size[0] // 32 if isinstance(model.visual.image_size, tuple) else model.visual.image_size // 32
    assert tokens.shape == (2, side * side, 128)


# --------------------------------------------------------------------------------------------------
# the faster layouts change nothing the model computes
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [TINY_SIGLIP, TINY_CLIP, TINY_RN])
def test_batch_first_text_blocks_compute_what_torch_multihead_attention_blocks_compute(name):
    """The tiny configs build open_clip's batch-first text blocks (block_type custom, faster on CPU); a
    checkpoint of the default nn.MultiheadAttention blocks loads into them by the same keys, to the same outputs."""
    model, tokenizer = _model(name)
    assert type(getattr(model, "text", model).transformer.resblocks[0]).__name__ == "CustomResidualAttentionBlock"
    torch.manual_seed(0)
    default = open_clip.create_model(name, nonscalar_logit_scale=True, text_cfg={**open_clip.get_model_config(name)["text_cfg"],
                                                                                 "block_type": "default"})
    assert isinstance(getattr(default, "text", default).transformer.resblocks[0].attn, torch.nn.MultiheadAttention)
    model.load_state_dict(default.state_dict())  # strict: the same parameter names
    tokens = tokenizer(["a red circle left of a blue square", "a square", "blue"])
    model.eval(), default.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(tokens), default.encode_text(tokens), rtol=1e-5, atol=1e-5)


def test_an_empty_text_batch_encodes_to_no_rows_and_keeps_the_graph():
    model, tokenizer = _model(TINY_RN)
    module = TrainingModule(model, C2LIPLoss())
    empty = module.encode_text(tokenizer(["x"])[:0])
    assert empty.shape == (0, 128)
    (empty.sum() + module.encode_text(tokenizer(["x"])).sum()).backward()
    assert model.text.token_embedding.weight.grad is not None


def test_a_conv_image_tower_reads_channels_last_images_to_the_same_features():
    model, _ = _model(TINY_RN)
    model.eval()
    module = TrainingModule(model, C2LIPLoss())
    assert module.channels_last and not TrainingModule(_model(TINY_SIGLIP)[0], C2LIPLoss()).channels_last
    images = _images(4)
    with torch.no_grad():
        torch.testing.assert_close(module.encode_image(images), model.encode_image(images.contiguous(), normalize=True), rtol=1e-5, atol=1e-5)
