"""The backend registry as values: which engine entries exist and which one serves a model.

A `Backend` is one registered engine (an executable of some `kind`, ★ default for some model
classes). `KIND_CLASSES` says which classes each kind serves; a kind may serve several
(llama-server runs chat, embedding and rerank models; audio.cpp speaks and transcribes), so
"does this backend serve that class" is always a set question, never an equality test against
one label.

`resolve_backend` picks the entry for one model and says why in a sentence for the model row:

1. the model's pin, when it names an entry that can run the model (otherwise the pin is stale:
   resolution goes on and the reason says what was wrong with it);
2. a Hugging Face folder needs vLLM (llama.cpp reads no safetensors): the vLLM entry that is ★
   for the class, else the first vLLM entry, else the model is skipped and the reason says so;
3. a family hint, where the class's engines read different weights (TTS, ASR, image): an entry
   of that family (its `family` lists the hint, or its kind is the hint), ★ first, beats a ★
   default of another family; an unmatched hint is named in the reason. The hint is the
   model's architecture unless the caller gives one (`model_family`), so an audio.cpp ★ for
   ASR does not take a Parakeet or whisper model from an installed entry of its own engine;
4. the ★ default of the class;
5. the first entry that serves the class;
6. nothing, and the reason says what to add.

Only a model without a pin follows a later ★ switch. Everything here is pure: the stored form
(`qmgui.settings.BackendEntry`) converts to and from `Backend` in the settings layer, and the
probing that fills `version` and `capabilities` lives outside the core.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from qmgui.core.errors import SettingsError
from qmgui.core.meta import ModelClass, ModelMeta
from qmgui.core.vllm import vllm_preferred

if TYPE_CHECKING:
    from qmgui.core.errors import SettingsError
from qmgui.core.discovery import ModelEntry

__all__ = [
    "CLASSES",
    "CUSTOM",
    "FAMILY_CLASSES",
    "KINDS",
    "KIND_ALIASES",
    "KIND_CLASSES",
    "REGISTRY_ONLY_CLASSES",
    "Backend",
    "BackendChoice",
    "canonical_kind",
    "classes_served",
    "clear_default",
    "default_for_class",
    "default_problem",
    "find_backend",
    "is_class_served",
    "kind_classes",
    "model_family",
    "registry_problems",
    "resolve_backend",
    "set_default",
    "sort_classes",
]

CLASSES: tuple[str, ...] = (
    "llm", "embedding", "rerank", "image", "tts", "asr", "segment", "upscale", "3d",
)  # fmt: skip
"""The model classes a backend can serve, in the order the UI lists them. A projector
(mmproj) is no class of its own: it is loaded with its model."""

REGISTRY_ONLY_CLASSES = frozenset({"segment", "upscale", "3d"})
"""Classes whose engines live only in the registry (reference 001, "upscale is registry-only"):
segmentation (SAM), upscaling (Real-ESRGAN) and 3D (TRELLIS) engines take no model file qmgui
discovers, so an entry of these classes is stored, listed and ★-able, its executable read by
whoever runs it per request, and it never adds or changes a command, a plan or an export."""

CUSTOM = "custom"
VLLM = "vllm"

# Which classes each kind serves. The reference registry maps llama/vllm to "llm" only, and
# counts embedders as "llm"; qmgui has embedding and rerank classes, and both engines serve
# them (llama-server with --embedding / --reranking, vLLM with its pooling runners).
KIND_CLASSES: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        # llama.cpp's llama-server: chat/completion, --embedding, --reranking.
        "llama": frozenset({"llm", "embedding", "rerank"}),
        # `vllm serve`: generation, and embed/score with a pooling model. The only kind that
        # reads a Hugging Face folder (safetensors) as well as a GGUF file.
        "vllm": frozenset({"llm", "embedding", "rerank"}),
        # stable-diffusion.cpp's server: diffusion models (reference: sd → image).
        "sd": frozenset({"image"}),
        # whisper.cpp's server: speech to text (not in the reference's table).
        "whisper": frozenset({"asr"}),
        # a Parakeet server: speech to text (reference: parakeet → asr).
        "parakeet": frozenset({"asr"}),
        # TTS.cpp-style speech servers (reference: tts → tts).
        "tts": frozenset({"tts"}),
        # Kokoro: speech synthesis with its own weights (reference: kokoro → tts).
        "kokoro": frozenset({"tts"}),
        # audio.cpp: one binary that speaks and transcribes (reference: audiocpp → tts + asr),
        # the kind that makes every "is this class served" a set question.
        "audiocpp": frozenset({"tts", "asr"}),
        # Segment Anything servers (reference: sam, sam3, segment → segment).
        "sam": frozenset({"segment"}),
        # realesrgan-ncnn-vulkan and kin (reference: upscale, realesrgan, esrgan → upscale).
        "realesrgan": frozenset({"upscale"}),
        # TRELLIS image-to-3D (reference: trellis, trellis2, 3d → 3d).
        "trellis": frozenset({"3d"}),
        # anything else: serves the classes its entry declares (`Backend.classes`).
        CUSTOM: frozenset(),
    }
)

KINDS: tuple[str, ...] = tuple(KIND_CLASSES)
"""Every kind the registry accepts, in the order the UI lists them."""

KIND_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        # the other spellings the reference's registry reads for each kind (000, kindClasses);
        # matched after `canonical_kind` lowers the case and drops every space
        "llama.cpp": "llama",
        "llamacpp": "llama",
        "server": "llama",
        "llama-server": "llama",
        "sd-server": "sd",
        "image": "sd",
        "whisper.cpp": "whisper",
        "whisper-server": "whisper",
        "asr": "parakeet",
        "parakeet-server": "parakeet",
        "transcribe": "parakeet",
        "tts-server": "tts",
        "speech": "tts",
        "ttscpp": "tts",
        "tts.cpp": "tts",
        "audio.cpp": "audiocpp",
        "audiocpp-server": "audiocpp",
        "sam3": "sam",
        "segment": "sam",
        "upscale": "realesrgan",
        "esrgan": "realesrgan",
        "realesrgan-ncnn-vulkan": "realesrgan",
        "trellis2": "trellis",
        "3d": "trellis",
    }
)
"""Other spellings of a kind (reference 000): read anywhere a kind is read (the settings file,
`qmgui backends add --kind`, a `Backend` made in code), in any case, with spaces, dashes and
underscores ignored, and stored as the kind they name."""

FAMILY_CLASSES = frozenset({"image", "tts", "asr"})
"""Classes whose engines are not interchangeable: each reads its own weights format (Kokoro
weights do not load in TTS.cpp, nor Parakeet's in whisper.cpp), so a family hint beats the ★
default there. llama-server and vLLM both load any LLM, embedding or rerank GGUF, so a hint is
ignored for those classes."""

_HF_NOTE = "cannot read a Hugging Face folder"


def _squashed(name: str) -> str:
    """`name` lower-case without spaces, dashes or underscores: "AudioCpp Server" and
    "audiocpp-server" are one key."""
    return _SQUASH.sub("", name).lower()


_SQUASH = re.compile(r"[\s_-]+")
_KIND_KEYS: Mapping[str, str] = MappingProxyType(
    {_squashed(k): v for k, v in KIND_ALIASES.items()} | {_squashed(k): k for k in KINDS}
)


def canonical_kind(kind: str) -> str:
    """The registry's name for `kind`: any case and spacing of a kind or of one of its other
    spellings (`KIND_ALIASES`: " Llama.CPP " is llama, "tts server" is tts); a name that is
    neither is returned unchanged, so the error about it quotes what was given."""
    if kind in KIND_CLASSES:
        return kind
    return _KIND_KEYS.get(_squashed(kind), kind)


def model_family(meta: ModelMeta) -> str | None:
    """The family hint a model's header gives (its architecture: kokoro, whisper, flux…), for
    the classes whose engines read different weights (`FAMILY_CLASSES`); None elsewhere."""
    if meta.model_class.value not in FAMILY_CLASSES:
        return None
    return meta.architecture.strip().lower() or None


def kind_classes(kind: str, declared: Iterable[str] = ()) -> frozenset[str]:
    """The classes a backend of `kind` serves: the table's set, or for `custom` the classes
    its entry declares (unknown class names in `declared` are dropped). Unknown kinds serve
    nothing; another spelling of a kind serves what the kind serves."""
    kind = canonical_kind(kind)
    if kind == CUSTOM:
        return frozenset(c for c in declared if c in CLASSES)
    return KIND_CLASSES.get(kind, frozenset())


def sort_classes(classes: Iterable[str]) -> list[str]:
    """Class names in the UI's order (`CLASSES`), unknown names last, alphabetically."""
    order = {c: i for i, c in enumerate(CLASSES)}
    return sorted(set(classes), key=lambda c: (order.get(c, len(order)), c))


@dataclass(frozen=True)
class Backend:
    """One registered engine.

    `default_for` holds the classes this entry is the ★ default of. `managed` is True when qmgui
    installed the executable (and may update or remove it). `version`, `variant` (cuda, rocm,
    vulkan, sycl, cpu…) and `build` (the engine's build number, such as llama.cpp's b6000) are
    informative; `capabilities` is what probing found (`{"flags": frozenset(...), "devices":
    [...]}`). `classes` is read only for `custom` kinds. `family` names the model families the
    entry serves (comma-separated), for classes whose engines read different weights.
    """

    id: str
    kind: str
    executable: str
    default_for: frozenset[str] = frozenset()
    managed: bool = False
    version: str | None = None
    variant: str | None = None
    build: int | None = None
    # a read-only copy; left out of the hash because its values need not be hashable
    capabilities: Mapping[str, object] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    classes: frozenset[str] = frozenset()
    family: str | None = None

    def __post_init__(self) -> None:
        # Accept any iterable (a list from a form, a set) and keep the value immutable, so a
        # caller's later changes to what it passed in never reach a frozen Backend.
        object.__setattr__(self, "kind", canonical_kind(self.kind))
        object.__setattr__(self, "default_for", frozenset(self.default_for))
        object.__setattr__(self, "classes", frozenset(self.classes))
        object.__setattr__(self, "capabilities", MappingProxyType(dict(self.capabilities)))

    @property
    def served_classes(self) -> frozenset[str]:
        """Every class this entry serves (see `kind_classes`)."""
        return kind_classes(self.kind, self.classes)

    def serves(self, model_class: str) -> bool:
        """Whether this entry can run models of `model_class`."""
        return model_class in self.served_classes

    @property
    def registry_only(self) -> bool:
        """Whether this entry serves only `REGISTRY_ONLY_CLASSES` (an upscaler, a SAM or
        TRELLIS server): it runs no discovered model, so it changes no plan or export."""
        served = self.served_classes
        return bool(served) and served <= REGISTRY_ONLY_CLASSES

    @property
    def families(self) -> frozenset[str]:
        """The model families this entry serves, lower-case (from `family`, comma-separated)."""
        if not self.family:
            return frozenset()
        return frozenset(f.strip().lower() for f in self.family.split(",") if f.strip())

    @property
    def flags(self) -> frozenset[str]:
        """The command-line flags probing found (`capabilities["flags"]`); empty when not
        probed. Stored capabilities hold a list, freshly probed ones a set: both read here."""
        raw = self.capabilities.get("flags")
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Iterable):
            return frozenset()
        return frozenset(f for f in raw if isinstance(f, str))

    def capabilities_json(self) -> dict[str, object]:
        """`capabilities` as plain JSON values: sets become sorted lists, tuples lists."""
        return {str(k): _plain(v) for k, v in self.capabilities.items()}

    def to_json(self) -> dict[str, object]:
        """The entry for `--json` output and the registry dialog."""
        return {
            "id": self.id,
            "kind": self.kind,
            "executable": self.executable,
            "serves": sort_classes(self.served_classes),
            "default_for": sort_classes(self.default_for),
            "classes": sort_classes(self.classes),
            "managed": self.managed,
            "version": self.version,
            "variant": self.variant,
            "build": self.build,
            "family": self.family,
            "capabilities": self.capabilities_json(),
        }


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return [_plain(v) for v in sorted(value, key=repr)]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class BackendChoice:
    """What `resolve_backend` decided for one model.

    `reason` is a sentence for the model row. `skipped` is True when the model was read but is
    left out on purpose because no registered engine can load it (a Hugging Face folder with no
    vLLM entry): an exporter writes the reason as a "skipped" note. A model with no backend and
    `skipped` False is a gap the user fills by adding a backend, or a model that could not be
    read.
    """

    backend: Backend | None
    reason: str
    skipped: bool = False

    @property
    def backend_id(self) -> str | None:
        return self.backend.id if self.backend else None


# --- lookups --------------------------------------------------------------------------------


def find_backend(backends: Sequence[Backend], backend_id: str) -> Backend | None:
    """The entry with this id (the first, if the registry holds duplicates)."""
    return next((b for b in backends if b.id == backend_id), None)


def default_for_class(backends: Sequence[Backend], model_class: str) -> Backend | None:
    """The ★ default of `model_class`: the first entry that is ★ for it and serves it."""
    return next(
        (b for b in backends if model_class in b.default_for and b.serves(model_class)), None
    )


def classes_served(backends: Iterable[Backend]) -> frozenset[str]:
    """Every class some entry serves, counting every class of a multi-class kind."""
    served: set[str] = set()
    for backend in backends:
        served |= backend.served_classes
    return frozenset(served)


def is_class_served(model_class: str, backends: Iterable[Backend]) -> bool:
    """Whether some entry serves `model_class` (audio.cpp serving tts also serves asr)."""
    return any(b.serves(model_class) for b in backends)


# --- resolution -----------------------------------------------------------------------------


def resolve_backend(
    model: ModelEntry,
    backends: Sequence[Backend],
    *,
    pin: str | None = None,
    family_hint: str | None = None,
) -> BackendChoice:
    """Pick the entry that serves `model`, with the reason; see the module docstring.

    `family_hint` None takes the hint from the model's header (`model_family`: every caller,
    the command line and the window alike, resolves a Kokoro or Parakeet model to its own
    family's entry); a blank hint asks for none."""
    meta = model.meta
    if meta is None:
        why = f" ({model.error})" if model.error else ""
        return BackendChoice(None, f"the model could not be read{why}: no backend chosen")
    model_class = meta.model_class.value
    if meta.model_class is ModelClass.PROJECTOR:
        return BackendChoice(None, "a projector is loaded with its model, not on its own")
    if family_hint is None:
        family_hint = model_family(meta)
    hf = vllm_preferred(meta)
    pin = pin.strip() if pin else None
    if not pin:
        return _auto(model_class, backends, hf=hf, family_hint=family_hint)
    pinned = find_backend(backends, pin)
    stale = _stale_pin_problem(pinned, model_class, hf=hf)
    if stale is None:
        return BackendChoice(pinned, "pinned")
    auto = _auto(model_class, backends, hf=hf, family_hint=family_hint)
    then = f"used {auto.reason}" if auto.backend else auto.reason
    return replace(auto, reason=f"stale pin {pin!r} ({stale}): {then}")


def _stale_pin_problem(pinned: Backend | None, model_class: str, *, hf: bool) -> str | None:
    """Why a pin cannot be used, or None when it can."""
    if pinned is None:
        return "no such backend"
    if not pinned.serves(model_class):
        return f"a {pinned.kind} backend does not serve {model_class}"
    # A custom engine the user pinned on purpose may well read safetensors (qmgui cannot
    # know); every built-in kind but vLLM certainly does not.
    if hf and pinned.kind not in (VLLM, CUSTOM):
        return f"a {pinned.kind} backend {_HF_NOTE}"
    return None


def _auto(
    model_class: str, backends: Sequence[Backend], *, hf: bool, family_hint: str | None
) -> BackendChoice:
    """Steps 2–6 of the resolution order: everything after the pin."""
    serving = [b for b in backends if b.serves(model_class)]
    if hf:
        return _for_hf_folder(model_class, backends, serving)
    star = default_for_class(serving, model_class)
    hint = (family_hint or "").strip().lower()
    note = ""
    if hint and model_class in FAMILY_CLASSES:
        family = [b for b in serving if hint in b.families or b.kind == hint]
        family_star = default_for_class(family, model_class)
        if family_star is not None:
            return BackendChoice(family_star, f"★ default for {model_class} (family {hint!r})")
        if family:
            return BackendChoice(family[0], f"first {model_class} backend for family {hint!r}")
        note = f" (no {model_class} backend for family {hint!r})"
    if star is not None:
        return BackendChoice(star, f"★ default for {model_class}{note}")
    if serving:
        return BackendChoice(serving[0], f"first {model_class} backend{note}")
    return BackendChoice(None, f"no backend serves {model_class}: add one in Backends")


def _for_hf_folder(
    model_class: str, backends: Sequence[Backend], serving: Sequence[Backend]
) -> BackendChoice:
    """Only vLLM reads a Hugging Face folder, so it wins over a ★ llama default; with no vLLM
    entry the model is skipped rather than handed to an engine that cannot load it."""
    vllm = [b for b in serving if b.kind == VLLM]
    star = default_for_class(vllm, model_class)
    if star is not None:
        return BackendChoice(star, f"★ default for {model_class}")
    if vllm:
        other = default_for_class(serving, model_class)
        if other is not None:
            why = f"the ★ {model_class} default {other.id!r} is {other.kind} and {_HF_NOTE}"
        else:
            why = "Hugging Face folder"
        return BackendChoice(vllm[0], f"first vLLM backend for {model_class} ({why})")
    if any(b.kind == VLLM for b in backends):
        return BackendChoice(
            None, f"Hugging Face folder needs vLLM: no vLLM backend serves {model_class}", True
        )
    return BackendChoice(None, "Hugging Face folder needs vLLM: no vLLM backend registered", True)


# --- changing the registry ------------------------------------------------------------------


def default_problem(backends: Sequence[Backend], backend_id: str, model_class: str) -> str | None:
    """Why `backend_id` cannot be made the ★ default of `model_class`, or None when it can."""
    if model_class not in CLASSES:
        return f"unknown model class {model_class!r}; one of {', '.join(CLASSES)}"
    backend = find_backend(backends, backend_id)
    if backend is None:
        return f"no backend has the id {backend_id!r}"
    if not backend.serves(model_class):
        served = ", ".join(sort_classes(backend.served_classes)) or "nothing"
        return (
            f"backend {backend_id!r} ({backend.kind}) does not serve {model_class}; it serves"
            f" {served}"
        )
    return None


def set_default(
    backends: Sequence[Backend], backend_id: str, model_class: str
) -> tuple[Backend, ...]:
    """The registry with the ★ of `model_class` moved to `backend_id` (a class has at most one
    ★). Raises SettingsError with `default_problem`'s sentence when that cannot be done; callers
    that want the sentence without an exception ask `default_problem` first."""
    problem = default_problem(backends, backend_id, model_class)
    if problem is not None:
        raise SettingsError(problem)
    target = find_backend(backends, backend_id)
    return tuple(_star_moved(b, target, model_class) for b in backends)


def _star_moved(backend: Backend, target: Backend | None, model_class: str) -> Backend:
    if backend is target:
        return replace(backend, default_for=backend.default_for | {model_class})
    if model_class in backend.default_for:
        return replace(backend, default_for=backend.default_for - {model_class})
    return backend


def clear_default(backends: Sequence[Backend], model_class: str) -> tuple[Backend, ...]:
    """The registry with no ★ for `model_class`: its models take the first entry that serves it."""
    return tuple(
        replace(b, default_for=b.default_for - {model_class}) if model_class in b.default_for else b
        for b in backends
    )


def registry_problems(backends: Sequence[Backend]) -> tuple[str, ...]:
    """Sentences for what is wrong with a registry; empty when nothing is. Never raises: a
    registry with problems still resolves (the first duplicate, the first ★ wins)."""
    problems: list[str] = []
    seen: set[str] = set()
    stars: dict[str, str] = {}
    for b in backends:
        if not b.id.strip():
            problems.append(f"a {b.kind} backend has a blank id")
        elif b.id in seen:
            problems.append(f"backend id {b.id!r} is used by more than one backend")
        seen.add(b.id)
        problems += _entry_problems(b)
        for model_class in sort_classes(b.default_for):
            if not b.serves(model_class):
                problems.append(
                    f"backend {b.id!r} is ★ for {model_class}, which a {b.kind} backend does"
                    " not serve"
                )
            elif model_class in stars:
                problems.append(
                    f"backends {stars[model_class]!r} and {b.id!r} are both ★ for"
                    f" {model_class}; {stars[model_class]!r} is used"
                )
            else:
                stars[model_class] = b.id
    return tuple(problems)


def _entry_problems(b: Backend) -> list[str]:
    """What is wrong with one entry on its own."""
    if b.kind not in KIND_CLASSES:
        return [f"backend {b.id!r} has an unknown kind {b.kind!r}; one of {', '.join(KINDS)}"]
    problems: list[str] = []
    if not b.executable.strip():
        problems.append(f"backend {b.id!r} has no executable")
    unknown = sorted(c for c in b.classes if c not in CLASSES)
    if unknown:
        problems.append(
            f"backend {b.id!r} declares unknown classes {', '.join(unknown)}; one of"
            f" {', '.join(CLASSES)}"
        )
    if b.kind == CUSTOM and not b.served_classes:
        problems.append(f"custom backend {b.id!r} declares no class, so it serves no model")
    elif b.kind != CUSTOM and b.classes:
        problems.append(
            f"backend {b.id!r} declares classes, which only custom backends use; a {b.kind}"
            f" backend serves {', '.join(sort_classes(b.served_classes))}"
        )
    return problems
