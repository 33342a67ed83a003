"""The training objectives, one loss module per method family (open_clip keeps one per objective too):
:class:`ContrastiveLoss` (SigLIP / CLIP), :class:`C2LIPLoss` (concept terms), :class:`HardExampleLoss`
(NegCLIP, hard positives + negatives) and :class:`CLICLoss`; the single-device formulas they share.
Pure torch, no I/O. :mod:`components.method.methods` says which method uses which.

Each loss module has ``forward`` on embeddings (testable in milliseconds) and ``step(towers, **batch)``,
which encodes what its batch carries with a :class:`~components.method.module.TrainingModule`'s towers and
calls ``forward``; a batch's keys are those its method's batch builder (:mod:`components.method.batches`)
writes.

Notation as in docs/architecture.md ("The C2LIP method"): x_i image embeddings, t_i caption embeddings, c_k phrase
(concept) embeddings, u_mj token features of image m, s = exp(logit_scale), b = logit_bias.

    L = L_sig + λ_npc·L_npc + λ_xac·L_xac          (λ_npc = 1, λ_xac = 0.01)

With world size W > 1 the contrastive terms gather the image and caption embeddings with their gradient, so
every rank computes the loss of the global batch (B² pairs: cheap); each rank's backward then yields W × its
share of the true gradient, and the data-parallel mean (DDP, DeepSpeed) gives the true gradient exactly.

The concept terms are sums over (image, phrase) pairs, and L_xac's pairs are costly (every phrase attends over
every image's tokens). Each rank scores only its own images against every rank's phrases (gathered with their
gradient, with each phrase's image index offset by the images of the ranks before): its rows of the global
[M, K] sum. The W partial sums add up to the global loss; the rank's term is W × its partial sum in the backward
(so the data-parallel mean is the global gradient, as above) and the all-reduced global value in the forward (so
every rank logs the global loss). No rank gathers image tokens; a rank's concept work is its M/W images × K
phrases, 1/W of the global batch's (the global batch's pairs grow with W², so at a fixed per-GPU batch a rank's
share still grows with W; bench/concept_scaling.py). (The released C2LIP code indexed local image features with
global labels.)
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from open_clip.loss import SigLipLoss
from torch.utils.checkpoint import checkpoint

from components.method.gathering import distributed, gather_ids, gather_rows, sum_over_ranks
from components.method.models import encode_concepts, image_features_and_tokens, text_context_length

# --------------------------------------------------------------------------------------------------
# loss terms (single-device formulas; the module below gathers first)
# --------------------------------------------------------------------------------------------------

_siglip = SigLipLoss(cache_labels=False)  # rank 0 of world 1: it sees the already gathered global batch


def sigmoid_contrastive(image_features, text_features, scale, bias) -> torch.Tensor:
    """L_sig: open_clip's SigLIP loss, −Σ log σ(y·(s⟨x_i, t_j⟩ + b)) / B, y = +1 on the diagonal."""
    return _siglip(image_features, text_features, scale, bias)


def softmax_contrastive(image_features, text_features, scale, bias=None) -> torch.Tensor:
    """CLIP's loss: mean of image→text and text→image cross-entropy. The bias, when the model has
    one, is added (softmax ignores a constant), so it still takes part and DDP sees a gradient."""
    logits = scale * image_features @ text_features.T
    if bias is not None:
        logits = logits + bias
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def multi_positive_contrastive(image_features, text_features, positive, query, scale, bias, kind: str = "sigmoid") -> torch.Tensor:
    """Contrastive loss where an image may have several positive texts and texts may be extra negatives
    (NegCLIP's hard negatives, hard positives + negatives). image_features [B, D], text_features [T, D];
    positive [B, T] bool (text t describes image i); query [T] bool (texts used as text→image queries:
    captions and hard positives, not hard negatives; each has exactly one positive image).

    sigmoid: −Σ log σ(y·(s⟨x_i, t_j⟩ + b)) / B with y = +1 on positives (SigLIP's loss when positive = I).
    softmax: image→text, each positive pair against the image's negatives only (its other positives are
    left out of the denominator, so two true captions never compete), averaged over positive pairs; plus
    text→image cross-entropy over the query texts; the mean of the two (CLIP's loss when positive = I).
    """
    logits = scale * image_features @ text_features.T
    if bias is not None:
        logits = logits + bias
    if kind == "sigmoid":
        labels = positive.to(logits.dtype) * 2 - 1
        return -F.logsigmoid(labels * logits).sum() / image_features.shape[0]
    negatives = logits.masked_fill(positive, float("-inf")).logsumexp(dim=1, keepdim=True)  # [B, 1]
    per_pair = torch.logaddexp(logits, negatives) - logits  # −log softmax of the pair against the negatives
    image_to_text = per_pair[positive].mean()
    owner = positive[:, query].float().argmax(dim=0)
    text_to_image = F.cross_entropy(logits[:, query].T, owner)
    return (image_to_text + text_to_image) / 2


def clic_terms(image_features, positive_features, negative_features, has_negative, scale, bias, kind: str = "sigmoid") -> dict[str, torch.Tensor]:
    """CLIC's three terms (arXiv 2505.24424) on concatenated image pairs, unweighted.

    image_features [B, D] (composite images); positive_features [4, B, D] (p1: first sentences in image
    order, p2: the same in swapped order, p3, p4: one other sentence of each); negative_features [B, D]
    (the word swap of p1) with has_negative [B] bool (no word of a shared part of speech: no negative).
    ``cont``: the contrastive loss of the images against each positive set, averaged over the four (the
    negatives are not in it); ``sneg``: per positive, −log of its binary softmax against the image's
    negative, s⟨x, p⟩ vs s⟨x, n⟩ (the bias cancels); ``uni``: ‖t_p1 − t_p2‖², mean over images.
    """
    contrastive = sigmoid_contrastive if kind == "sigmoid" else softmax_contrastive
    cont = torch.stack([contrastive(image_features, p, scale, bias) for p in positive_features]).mean()
    pos = (positive_features * image_features.unsqueeze(0)).sum(-1)  # [4, B]
    neg = (negative_features * image_features).sum(-1)  # [B]
    margins = scale * (neg.unsqueeze(0) - pos)  # −log softmax([p, n])[p] = softplus(s(n − p))
    sneg = F.softplus(margins[:, has_negative]).mean() if bool(has_negative.any()) else margins.sum() * 0
    uni = (positive_features[0] - positive_features[1]).pow(2).sum(-1).mean()
    return {"cont": cont, "sneg": sneg, "uni": uni}


def concept_labels(image_index: torch.Tensor, num_images: int, dtype, phrase_ids: torch.Tensor | None = None,
                   first_image: int = 0) -> torch.Tensor:
    """[M, K]: +1 where phrase k is image m's, −1 elsewhere, for the images ``first_image`` … ``first_image + M − 1``
    of the batch ``image_index`` counts in (a rank's rows of the global batch).

    ``phrase_ids`` None: "its" means the occurrence came from image m (y_ik of the formula as written: the same
    phrase text from another image is a negative). ``phrase_ids`` [K] (equal ids = equal text): image m is
    positive for every phrase whose text is among its own phrases, so a repeated phrase ("a red circle" in
    several images of the batch) is never a negative for an image that has it.
    """
    rows = first_image + torch.arange(num_images, device=image_index.device).unsqueeze(1)
    if phrase_ids is None:
        own = image_index.unsqueeze(0) == rows
    else:
        mine = (image_index >= first_image) & (image_index < first_image + num_images)  # occurrences in these rows
        has = torch.zeros(num_images, int(phrase_ids.max()) + 1 if phrase_ids.numel() else 0, dtype=torch.bool, device=image_index.device)
        has[image_index[mine] - first_image, phrase_ids[mine]] = True
        own = has[:, phrase_ids]
    return own.to(dtype) * 2 - 1


def text_ids(keys: torch.Tensor) -> torch.Tensor:
    """[K] ids, equal exactly where the rows of ``keys`` (e.g. each occurrence's token ids) are equal."""
    return torch.unique(keys.reshape(keys.shape[0], -1), dim=0, return_inverse=True)[1] if keys.numel() else keys.new_zeros(0)


def npc_loss(image_features, phrase_features, image_index, scale, bias, phrase_ids=None, first_image: int = 0) -> torch.Tensor:
    """L_npc: −Σ_{i,k} log σ(y_ik·(s⟨x_i, c_k⟩ + b)) / K (y_ik: :func:`concept_labels`). Computed in fp32
    whatever the features' dtype (bf16 towers): the sum over every (image, phrase) pair is where low
    precision would add up. ``first_image``: the images are rows ``first_image …`` of the batch ``image_index``
    counts in; the result is then their share of the sum (still divided by every phrase, K)."""
    image_features, phrase_features = image_features.float(), phrase_features.float()
    logits = scale * image_features @ phrase_features.T + bias
    labels = concept_labels(image_index, image_features.shape[0], logits.dtype, phrase_ids, first_image)
    return -F.logsigmoid(labels * logits).sum() / max(phrase_features.shape[0], 1)


def _xac_chunk(tokens, phrases, labels, scale, bias, temperature: float) -> torch.Tensor:
    sims = torch.einsum("mjd,kd->mkj", tokens, phrases)  # ⟨c_k, u_mj⟩, [M, Kc, J]
    attention = (sims / temperature).softmax(dim=-1)  # a
    # ⟨v̂_mk, c_k⟩ with v = Σ_j a_j u_mj: the numerator is Σ_j a_j⟨u_mj, c_k⟩; the norm is taken of v itself.
    # (Its square as aᵀ(U Uᵀ)a avoids the [M, Kc, D] tensor but cancels catastrophically when a phrase's
    # attended tokens nearly cancel: in fp32 the loss is off by 1e-2 relative at |v| ≈ 3e-4, against 7e-8
    # this way; bench/losses.py, tests/test_method.py.)
    dot = (attention * sims).sum(-1)
    norm = torch.linalg.vector_norm(torch.einsum("mkj,mjd->mkd", attention, tokens), dim=-1).clamp_min(1e-12)
    logits = scale * (dot / norm) + bias
    return -F.logsigmoid(labels * logits).sum()


def xac_loss(image_tokens, phrase_features, image_index, scale, bias, temperature: float = 1.0, chunk: int = 512,
             phrase_ids=None, first_image: int = 0) -> torch.Tensor:
    """L_xac: each phrase attends over each image's tokens, a = softmax_j(⟨c_k, u_mj⟩ / τ),
    v̂_mk = normalize(Σ_j a_j u_mj), logit = s⟨v̂_mk, c_k⟩ + b; labels and normalisation as L_npc.

    Vectorised over images, phrases and tokens, and computed ``chunk`` phrases at a time; when there is
    more than one chunk each is recomputed in the backward pass (activation checkpointing), so peak
    memory is that of one chunk (a few [M, chunk, J] tensors and one [M, chunk, D]) whatever the number
    of phrases. In fp32 whatever the inputs' dtype, as :func:`npc_loss`; ``first_image`` as there.
    """
    image_tokens, phrase_features = image_tokens.float(), phrase_features.float()
    labels = concept_labels(image_index, image_tokens.shape[0], image_tokens.dtype, phrase_ids, first_image)
    total = image_tokens.new_zeros(())
    K = phrase_features.shape[0]
    for start in range(0, K, chunk):
        args = (image_tokens, phrase_features[start:start + chunk], labels[:, start:start + chunk], scale, bias, temperature)
        if torch.is_grad_enabled() and K > chunk:
            total = total + checkpoint(_xac_chunk, *args, use_reentrant=False)
        else:
            total = total + _xac_chunk(*args)
    return total / max(K, 1)


def _check_contrastive(contrastive: str) -> None:
    if contrastive not in ("sigmoid", "softmax"):
        raise ValueError(f"contrastive must be 'sigmoid' or 'softmax', got {contrastive!r}")


class ContrastiveLoss(nn.Module):
    """SigLIP's sigmoid loss (or CLIP's softmax loss) over the global batch: the ``siglip`` method, and
    CLIC's plain steps."""

    def __init__(self, contrastive: Literal["sigmoid", "softmax"] = "sigmoid"):
        super().__init__()
        _check_contrastive(contrastive)
        self.contrastive = contrastive

    def forward(self, image_features, text_features, logit_scale, logit_bias=None) -> dict[str, torch.Tensor]:
        """image_features, text_features [B, D] L2-normalised; logit_scale s (exponentiated)."""
        images, _ = gather_rows(image_features)
        texts, _ = gather_rows(text_features)
        return {"contrastive_loss": self.on_global_batch(images, texts, logit_scale, logit_bias)}

    def on_global_batch(self, images, texts, logit_scale, logit_bias=None) -> torch.Tensor:
        """The loss of already gathered embeddings (a loss that gathers them for other terms too)."""
        contrastive = sigmoid_contrastive if self.contrastive == "sigmoid" else softmax_contrastive
        return contrastive(images, texts, logit_scale, logit_bias)

    def step(self, towers, images, texts) -> dict[str, torch.Tensor]:
        return self(towers.encode_image(images), towers.encode_text(texts), *towers.logit_scale_bias())


class C2LIPLoss(nn.Module):
    """L = L_contrastive + λ_npc·L_npc + λ_xac·L_xac, returned as a dict of weighted terms whose sum is
    the loss (open_clip's ``output_dict`` contract). Terms with λ = 0 are not computed.

    ``concept_logit``: ``shared`` uses the model's s and b for the concept terms (the paper's choice);
    ``own`` gives them a learnable pair of their own, initialised from the model's values.

    ``concept_labels``: ``occurrence`` labels a phrase positive only for the image it came from (the formula
    as written); ``text`` for every image that has a phrase of the same text (:func:`concept_labels`).

    ``concept_text_grad`` False: the phrase embeddings are computed without gradient, so the concept terms
    move the image tower (and s, b) but never the text tower (an ablation: which tower carries their effects).
    """

    def __init__(
        self,
        contrastive: Literal["sigmoid", "softmax"] = "sigmoid",
        lambda_npc: float = 1.0,
        lambda_xac: float = 0.01,
        xac_temperature: float = 1.0,
        xac_chunk: int = 512,
        concept_logit: Literal["shared", "own"] = "shared",
        concept_labels: Literal["occurrence", "text"] = "occurrence",
        concept_text_grad: bool = True,
        init_logit_scale: float | None = None,
        init_logit_bias: float | None = None,
    ):
        super().__init__()
        _check_contrastive(contrastive)
        if xac_temperature <= 0 or xac_chunk < 1:
            raise ValueError("xac_temperature must be > 0 and xac_chunk >= 1")
        self.contrastive = ContrastiveLoss(contrastive)
        self.lambda_npc, self.lambda_xac = float(lambda_npc), float(lambda_xac)
        self.xac_temperature, self.xac_chunk = float(xac_temperature), int(xac_chunk)
        self.concept_logit = concept_logit
        if concept_labels not in ("occurrence", "text"):
            raise ValueError(f"concept_labels must be 'occurrence' or 'text', got {concept_labels!r}")
        self.concept_labels = concept_labels
        self.concept_text_grad = bool(concept_text_grad)
        if concept_logit == "own":
            if init_logit_scale is None or init_logit_bias is None:
                raise ValueError("concept_logit='own' needs init_logit_scale (log scale) and init_logit_bias")
            # 1-dim, like the model's own with nonscalar_logit_scale (DeepSpeed needs it)
            self.concept_logit_scale = nn.Parameter(torch.tensor([float(init_logit_scale)]))
            self.concept_logit_bias = nn.Parameter(torch.tensor([float(init_logit_bias)]))
        elif concept_logit != "shared":
            raise ValueError(f"concept_logit must be 'shared' or 'own', got {concept_logit!r}")

    @property
    def uses_concepts(self) -> bool:
        return self.lambda_npc > 0 or self.lambda_xac > 0

    def concept_scale_bias(self, scale: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.concept_logit == "own":
            return self.concept_logit_scale.exp(), self.concept_logit_bias
        if bias is None:
            raise ValueError("the model has no logit_bias for the concept terms: use concept_logit='own'")
        return scale, bias

    def forward(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor,
        logit_bias: torch.Tensor | None = None,
        phrase_features: torch.Tensor | None = None,
        phrase_image_index: torch.Tensor | None = None,
        image_tokens: torch.Tensor | None = None,
        phrase_keys: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Loss terms of this rank's view of the global batch.

        image_features, text_features: [B, D], L2-normalised; logit_scale: s (already exponentiated);
        phrase_features: [K, D] normalised; phrase_image_index: [K], local image of each phrase;
        image_tokens: [B, J, D] normalised token features (needed when λ_xac > 0);
        phrase_keys: [K, ...] integers equal exactly for phrases of equal text, e.g. their token ids (needed
        when concept_labels is ``text``).
        """
        images, counts = gather_rows(image_features)  # once, for the contrastive and the concept terms
        texts, _ = gather_rows(text_features)
        losses = {"contrastive_loss": self.contrastive.on_global_batch(images, texts, logit_scale, logit_bias)}
        if not self.uses_concepts:
            return losses
        if phrase_features is None or phrase_image_index is None:
            raise ValueError("the concept terms need phrase_features and phrase_image_index")
        offset = sum(counts[:dist.get_rank() if distributed() else 0])  # this rank's first image in the global batch
        phrases, _ = gather_rows(phrase_features)
        owner, _ = gather_rows(phrase_image_index + offset)  # global image index
        scale, bias = self.concept_scale_bias(logit_scale, logit_bias)
        ids = None
        if self.concept_labels == "text":
            if phrase_keys is None:
                raise ValueError("concept_labels='text' needs phrase_keys")
            ids = text_ids(gather_ids(phrase_keys))
        partial = {}  # this rank's images (rows) against every phrase: its share of each global sum
        if self.lambda_npc > 0:
            partial["npc_loss"] = self.lambda_npc * npc_loss(image_features, phrases, owner, scale, bias, ids, offset)
        if self.lambda_xac > 0:
            if image_tokens is None:
                raise ValueError("L_xac needs image_tokens")
            partial["xac_loss"] = self.lambda_xac * xac_loss(image_tokens, phrases, owner, scale, bias, self.xac_temperature,
                                                             self.xac_chunk, ids, offset)
        return {**losses, **sum_over_ranks(partial)}

    def step(self, towers, images, texts, phrase_tokens=None, phrase_inverse=None, phrase_image_index=None) -> dict[str, torch.Tensor]:
        """images [B, 3, H, W], texts [B, L] and the concept batch (:func:`~components.method.batches.concept_batch`)."""
        model = towers.model
        if self.uses_concepts and self.lambda_xac > 0:
            pooled, tokens = image_features_and_tokens(model, images)
            image_features, image_tokens = F.normalize(pooled, dim=-1), F.normalize(tokens, dim=-1)
        else:
            image_features, image_tokens = towers.encode_image(images), None
        text_features = towers.encode_text(texts)
        phrase_features = None
        if self.uses_concepts:
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.concept_text_grad):
                phrase_features = encode_concepts(model, phrase_tokens, phrase_inverse)
        keys = None
        if self.uses_concepts and self.concept_labels == "text":
            # rows of every rank compared as texts: back to the context's width (trimmed columns are padding)
            keys = phrase_tokens[phrase_inverse]
            missing = text_context_length(model) - keys.shape[1]
            if missing > 0 and keys.shape[0]:
                keys = F.pad(keys, (0, missing), value=int(keys[0, -1]))
        return self(image_features, text_features, *towers.logit_scale_bias(), phrase_features=phrase_features,
                    phrase_image_index=phrase_image_index, image_tokens=image_tokens, phrase_keys=keys)


class HardExampleLoss(nn.Module):
    """NegCLIP and hard positives + negatives: the multi-positive contrastive loss over the captions plus
    extra text rows, each a hard negative of its image (a negative for every image) or a hard positive of
    its own image (:func:`multi_positive_contrastive`)."""

    def __init__(self, contrastive: Literal["sigmoid", "softmax"] = "sigmoid"):
        super().__init__()
        _check_contrastive(contrastive)
        self.contrastive = contrastive

    def forward(self, image_features, text_features, logit_scale, logit_bias, extra_text_features, extra_owner, extra_positive) -> dict[str, torch.Tensor]:
        """image_features, text_features [B, D]; extra_text_features [E, D]; extra_owner [E] the local image
        each row was made from; extra_positive [E] bool (a hard positive of its image, else a negative)."""
        images, counts = gather_rows(image_features)
        texts, _ = gather_rows(text_features)
        offset = sum(counts[:dist.get_rank() if distributed() else 0])
        extras, _ = gather_rows(extra_text_features)
        owner, _ = gather_rows(extra_owner + offset)
        is_positive, _ = gather_rows(extra_positive.long())
        is_positive = is_positive.bool()
        B = images.shape[0]
        positive = torch.zeros(B, B + extras.shape[0], dtype=torch.bool, device=images.device)
        positive[:, :B] = torch.eye(B, dtype=torch.bool, device=images.device)
        columns = B + torch.nonzero(is_positive).flatten()
        positive[owner[is_positive], columns] = True
        query = torch.cat([torch.ones(B, dtype=torch.bool, device=images.device), is_positive])
        loss = multi_positive_contrastive(images, torch.cat([texts, extras]), positive, query, logit_scale, logit_bias, self.contrastive)
        return {"contrastive_loss": loss}

    def step(self, towers, images, texts, extra_texts, extra_owner, extra_positive) -> dict[str, torch.Tensor]:
        return self(towers.encode_image(images), towers.encode_text(texts), *towers.logit_scale_bias(),
                    towers.encode_text(extra_texts), extra_owner, extra_positive)


class CLICLoss(nn.Module):
    """CLIC's objective on a batch of concatenated image pairs (arXiv 2505.24424), as weighted terms:
    w_cont·L_cont + w_sneg·L_sneg + w_uni·L_uni (0.5, 0.5, 1.0 in the paper). ``contrastive`` picks the
    sigmoid (SigLIP-family models) or softmax form of L_cont; L_sneg is a binary softmax in both. Plain
    batches (CLIC alternates them with pair batches) get the plain contrastive loss."""

    def __init__(self, contrastive: Literal["sigmoid", "softmax"] = "sigmoid", weight_cont: float = 0.5,
                 weight_sneg: float = 0.5, weight_uni: float = 1.0):
        super().__init__()
        self.plain = ContrastiveLoss(contrastive)
        self.contrastive = contrastive
        self.weights = {"cont": float(weight_cont), "sneg": float(weight_sneg), "uni": float(weight_uni)}

    def forward(self, image_features, positive_features, negative_features, has_negative, logit_scale, logit_bias=None) -> dict[str, torch.Tensor]:
        """image_features [B, D]; positive_features [4, B, D]; negative_features [B, D]; has_negative [B] bool."""
        images, _ = gather_rows(image_features)
        positives, _ = gather_rows(positive_features.transpose(0, 1))  # rows are images: [B, 4, D]
        negatives, _ = gather_rows(negative_features)
        has_negative, _ = gather_rows(has_negative.long())
        terms = clic_terms(images, positives.transpose(0, 1), negatives, has_negative.bool(), logit_scale, logit_bias, self.contrastive)
        return {f"clic_{k}_loss": self.weights[k] * v for k, v in terms.items()}

    def step(self, towers, images, texts, clic_negative_texts=None, clic_has_negative=None) -> dict[str, torch.Tensor]:
        """A pair batch: composite images [B, ...], texts [4B, L] (p1..p4 blocks of B), clic_negative_texts
        [B, L], clic_has_negative [B]; without the negatives, a plain batch."""
        if clic_negative_texts is None:
            return self.plain.step(towers, images, texts)
        image_features = towers.encode_image(images)
        positives = towers.encode_text(texts).view(4, images.shape[0], -1)
        negatives = towers.encode_text(clic_negative_texts)
        return self(image_features, positives, negatives, clic_has_negative, *towers.logit_scale_bias())
