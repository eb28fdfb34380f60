"""The ``calculator`` environment (``rl_engine.envs.calculator``): its evaluator runs arithmetic and
nothing else (never ``eval``), scripted episodes get the tool's messages and figures, a tool message's
tokens are what the model's chat template puts between two turns (SmolLM2's, the tiny model's, and a
template with no tool role), an episode cut by its turn budget keeps its figures, and a real run of the
HF worker on the tiny model plays calculator episodes."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from rl_engine import wire
from rl_engine.config import ConfigError, parse_config
from rl_engine.data import PromptStream
from rl_engine.envs.arithmetic import MAX_CHARS, ExpressionError, evaluate, format_number
from rl_engine.envs.base import Episode
from rl_engine.envs.calculator import SYSTEM_PROMPT, calculator, tool_calls
from rl_engine.envs.chat_turns import observation_ids, observation_text, tool_response
from rl_engine.envs.episodes import META, EpisodeWorker
from rl_engine.envs.transcript import episode_turns
from rl_engine.pipeline.components import real_reward, real_worker
from rl_engine.types import ExampleSample, Prompt, Sample

SMOLLM2 = Path(__file__).resolve().parents[2] / "var/models/smollm2-135m-instruct"


def call(expression: str, name: str = "calculator") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


# --- the evaluator ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, value",
    [
        ("12*7", "84"),
        (" (1 + 2) * 3 ", "9"),
        ("7/2", "3.5"),
        ("7//2", "3"),
        ("-7 % 3", "2"),
        ("2**10", "1024"),
        ("2**-1", "0.5"),
        ("-(3 - +5)", "2"),
        ("1.5*2", "3"),
        ("1/3", "0.333333333333"),
        ("2**100", str(2**100)),
        ("(" * 60 + "1" + ")" * 60, "1"),
    ],
)
def test_the_evaluator_computes_arithmetic(expression, value, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert format_number(evaluate(expression)) == value


@pytest.mark.parametrize(
    "expression, reason",
    [
        ("x + 1", "Name is not allowed"),
        ("__import__('os').system('true')", "Call is not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("abs(-1)", "Call is not allowed"),
        ("[1][0]", "Subscript is not allowed"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 1j", "only numbers"),
        ("1 < 2", "Compare is not allowed"),
        ("1 << 2", "BinOp is not allowed"),
        ("~1", "UnaryOp is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("2**1000", "exponent is larger than 100"),
        ("10**10**10", "exponent is larger than 100"),
        ("(9**100)**100", "too large"),
        ("9**100 * 9**100 * 9**100 * 9**100", "too large"),
        ("1e308 * 10", "not finite"),
        ("1e999", "not finite"),
        ("10.0**101", "exponent is larger than 100"),
        ("10.0**100 * 1e300", "not finite"),
        ("(-8)**0.5", "not a real number"),
        ("1/0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("0**-1", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1; 2", "not an arithmetic expression"),
        ("", "empty"),
        ("1+" * 100 + "1", f"longer than {MAX_CHARS}"),
    ],
)
def test_the_evaluator_refuses_everything_but_bounded_arithmetic(expression, reason):
    with pytest.raises(ExpressionError, match=reason.replace("*", r"\*")):
        evaluate(expression)


# --- scripted episodes -----------------------------------------------------------------------------------


def episode(*policy: str, replies: tuple[str, ...] = ()) -> Episode:
    return Episode("what is 12*7?", "84", {}, policy, replies)


def judge(ep: Episode, text: str) -> float:
    return float(text.strip().endswith(ep.answer))


def test_a_tool_call_is_answered_in_a_tool_message_and_the_final_answer_is_judged():
    env = calculator(judge)
    first = env.step(episode(f"let me compute. {call('12*7')}"))
    assert not first.done and first.role == "tool" and first.message == "84"
    assert first.figures == {"tool_calls": 1.0, "tool_errors": 0.0}
    last = env.step(episode(call("12*7"), "it is 84", replies=("84",)))
    assert last.done and last.reward == 1.0
    assert last.figures == {"tool_calls": 1.0, "tool_errors": 0.0}
    wrong = env.step(episode("it is 85"))  # no call at all: the final answer, judged by the run's reward
    assert wrong.done and wrong.reward == 0.0 and wrong.figures == {"tool_calls": 0.0, "tool_errors": 0.0}


def test_bad_calls_are_answered_with_an_error_and_counted():
    env = calculator(judge, max_calls_per_turn=2)
    cases = {
        "<tool_call>not json</tool_call>": "error: the tool call is not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "error: a tool call is a JSON object",
        call("1+1", name="shell"): "error: unknown tool 'shell'; the tool is 'calculator'",
        '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>': "error: the arguments",
        '<tool_call>{"name": "calculator"}</tool_call>': "error: the arguments",
        call("__import__('os')"): "error: Call is not allowed",
        call("2**1000"): "error: the exponent is larger than 100",
    }
    for turn, message in cases.items():
        step = env.step(episode(turn))
        assert not step.done and step.role == "tool" and step.message.startswith(message), (turn, step)
        assert step.figures == {"tool_calls": 1.0, "tool_errors": 1.0}
    # the arguments as a JSON text (OpenAI style), a call cut off by the turn's budget, two calls a turn
    openai = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"6*7\\"}"}</tool_call>'
    assert env.step(episode(openai)).message == "42"
    cut = env.step(episode('<tool_call>{"name": "calculator", "arguments": {"expression": "1+'))
    assert cut.message == "error: the tool call is not valid JSON"
    two = env.step(episode(f"{call('1+1')}\n{call('x')}"))
    assert two.message == "2\nerror: Name is not allowed: only numbers, + - * / // % ** and ()"
    assert two.figures == {"tool_calls": 2.0, "tool_errors": 1.0}
    four = env.step(episode(call("1") * 4))
    assert four.message == "1\n1\nerror: at most 2 calls per turn; 2 not run"
    assert four.figures == {"tool_calls": 4.0, "tool_errors": 2.0}
    # figures count every policy turn of the episode
    done = env.step(episode(call("x"), call("1+1"), "2", replies=("error", "2")))
    assert done.done and done.figures == {"tool_calls": 2.0, "tool_errors": 1.0}


def test_the_system_prompt_shows_a_call_the_tool_answers():
    [body] = tool_calls(SYSTEM_PROMPT)
    env = calculator(judge)
    assert env.step(episode(f"<tool_call>{body}</tool_call>")).message == "84"


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_calls_per_turn": 0}, "env.kwargs"), ({"tools": ["x"]}, "env.kwargs")],
)
def test_bad_calculator_settings_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        parse_config({"model": {"path": "m"}, "env": {"name": "calculator", "kwargs": kwargs}})
    assert err.value.errors[0][0] == field, err.value.errors


# --- tool messages in the chat template ------------------------------------------------------------------

RAISING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ('user', 'assistant') %}"
    "{{ raise_exception('no role ' + m['role']) }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DROPPING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] in ('user', 'assistant') %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tokenizers(tiny_model_dir: Path) -> dict:
    from transformers import AutoTokenizer

    found = {"tiny": AutoTokenizer.from_pretrained(tiny_model_dir)}
    if SMOLLM2.is_dir():
        found["smollm2"] = AutoTokenizer.from_pretrained(SMOLLM2)
        for name, template in (("no tool role", RAISING_TEMPLATE), ("tool role dropped", DROPPING_TEMPLATE)):
            tok = AutoTokenizer.from_pretrained(SMOLLM2)
            tok.chat_template = template
            found[name] = tok
    return found


def test_a_tool_message_is_what_the_chat_template_puts_between_two_turns(tiny_model_dir):
    """Prompt + the policy's turn + observation ids decode to the template's rendering of the whole
    conversation, for a turn that stopped (eos sampled) and one cut by its budget."""
    found = tokenizers(tiny_model_dir)
    if "smollm2" not in found:
        pytest.skip("SmolLM2-135M-Instruct is not in var/models")
    for name, tok in found.items():
        # the tiny tokenizer knows lower case, digits and a little punctuation only
        question, answer, result = (
            ("12*7", "12*7 is", "84") if name == "tiny" else ("12*7?", call("12*7"), "84")
        )
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        policy = (
            tok(prompt, add_special_tokens=False)["input_ids"]
            + tok(answer, add_special_tokens=False)["input_ids"]
        )
        refused = name in ("no tool role", "tool role dropped")
        role, content = ("user", tool_response(result)) if refused else ("tool", result)
        expected = tok.apply_chat_template(
            [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
                {"role": role, "content": content},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        stopped = [*policy, tok.eos_token_id, *observation_ids(tok, result, "tool", policy_stopped=True)]
        assert tok.decode(stopped) == expected, name
        cut = [*policy, *observation_ids(tok, result, "tool", policy_stopped=False)]
        assert tok.decode(cut) == expected, name
    smollm2 = observation_text(found["smollm2"], "84", "tool", policy_stopped=True)
    assert smollm2 == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"
    assert observation_text(found["tiny"], "84", "tool", policy_stopped=True) == "tool: 84</s>assistant: "


# --- episodes through the EpisodeWorker ------------------------------------------------------------------


class ScriptedWorker:
    """A rollout worker whose policy says the script's turns, in order (each ending with eos)."""

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer, self.script = tokenizer, script
        self.interrupted = False
        self.max_turn_tokens: int | None = None

    def _say(self, s: Sample) -> Sample:
        turn = len((s.metadata.get(META) or {}).get("spans", []))
        ids = [
            *self.tokenizer(self.script[turn], add_special_tokens=False)["input_ids"],
            self.tokenizer.eos_token_id,
        ]
        s.response_ids = s.response_ids + ids
        s.logprobs = s.logprobs + [-0.5] * len(ids)
        s.finish_reason = "stop"
        return s

    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        return [
            self._say(Sample(p.uid, p.uid, p.token_ids, [], [], "stop", 0, 0, p.text, answer=p.answer))
            for p in prompts
            for _ in range(n)
        ]

    def resume(self, samples: list[Sample]) -> list[Sample]:
        return [self._say(s) for s in samples]


def play(script: list[str], max_turns: int) -> Sample:
    from transformers import AutoTokenizer

    if not SMOLLM2.is_dir():
        pytest.skip("SmolLM2-135M-Instruct is not in var/models")
    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    worker = EpisodeWorker(
        ScriptedWorker(tok, script), calculator(judge), max_turns=max_turns, max_tokens=512
    )
    [sample] = worker.generate([Prompt("p0", [1, 2], "what is 12*7?", "84", 0)], 1)
    return sample


def test_an_episode_carries_the_tool_messages_between_the_policys_turns():
    sample = play([call("12*7"), call("84-0"), "84"], max_turns=4)
    state = sample.metadata[META]
    assert state["replies"] == ["84", "84"] and state["final"] == "84"
    assert sample.extra["env/turns"] == 3.0 and sample.extra["env/truncated"] == 0.0
    assert (sample.extra["env/tool_calls"], sample.extra["env/tool_errors"]) == (2.0, 0.0)
    for start, end in state["spans"]:
        assert sample.loss_mask[start:end] == [0] * (end - start)


def test_an_episode_cut_by_its_turn_budget_keeps_its_figures():
    sample = play([call("12*7"), call("y"), call("1")], max_turns=2)
    assert sample.extra["env/turns"] == 2.0 and sample.extra["env/truncated"] == 1.0
    assert (sample.extra["env/tool_calls"], sample.extra["env/tool_errors"]) == (2.0, 1.0)


def test_an_episode_is_shown_turn_by_turn_within_the_wires_bounds():
    """Its example's turns: the policy's as decoded, the tool's messages, each with its tokens (they add
    up to the response) and a policy turn's mean behaviour log-prob; valid on the wire."""
    sample = play([call("12*7"), "it is 84"], max_turns=4)
    turns = episode_turns(sample)
    assert [(t.role, t.text) for t in turns] == [
        ("assistant", call("12*7")),
        ("tool", "84"),
        ("assistant", "it is 84"),
    ]
    assert sum(t.tokens for t in turns) == len(sample.response_ids)
    assert [t.logprob_mean for t in turns] == [-0.5, None, -0.5]
    example = ExampleSample("q", "r", "84", 1.0, 0, 0, turns=turns).to_dict()
    posted = wire.SampleIn.model_validate(wire.sample(example, 1))
    assert [(t.role, t.tokens) for t in posted.turns] == [(t.role, t.tokens) for t in turns]
    # a single-turn sample has none; a turn's text longer than the wire takes is cut, and says so
    assert episode_turns(Sample("p", "g", [], [1], [-1.0], "stop", 0, 0)) is None
    long = "7" * (wire.MAX_TURN_TEXT + 500)
    cut = Sample("p", "g", [], [1, 2], [-1.0, -3.0], "stop", 0, 0, metadata={META: {"policy": [long]}})
    [turn] = episode_turns(cut)
    assert len(turn.text) <= wire.MAX_TURN_TEXT and turn.text.endswith("more characters]")
    assert turn.text.startswith("7" * 1000) and turn.tokens == 2 and turn.logprob_mean == -2.0
    wire.TurnIn.model_validate(turn.__dict__)
    odd = Sample("p", "g", [], [1], [-1.0], "stop", 0, 0, metadata={META: {"policy": ["a\x00b\ud800"]}})
    assert episode_turns(odd)[0].text == "ab\ufffd"


def test_the_hf_worker_plays_calculator_episodes_on_the_tiny_model(make_cfg):
    """The tiny model writes no tool call (its vocabulary has no ``<``): every episode is one final
    answer, judged by the run's reward, with the calculator's figures."""
    cfg = make_cfg(
        "env.name=calculator",
        "env.max_turn_tokens=8",
        "rollout.max_new_tokens=64",
        "rollout.n=2",
    )
    worker = real_worker(cfg)
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), cfg.rollout.n)
    reward = real_reward(cfg)
    assert len(samples) == 4
    for s in samples:
        assert s.extra["env/done"] == 1.0 and s.extra["env/turns"] == 1.0
        assert s.extra["env/tool_calls"] == 0.0 and s.extra["env/tool_errors"] == 0.0
        assert 1 <= len(s.response_ids) <= 8 and reward(s) in (0.0, 1.0)
