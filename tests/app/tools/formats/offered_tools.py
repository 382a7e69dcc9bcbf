"""The tools the tool format tests offer, and the calls they expect."""

from app.tools.spec import ToolCall, ToolSpec

WEATHER = ToolSpec("get_weather", "Get the weather of a city.",
                   {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                     "days": {"type": "integer"}},
                    "required": ["city"]})
TIME = ToolSpec("get_time", "Get the time in a time zone.",
                {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]})
TOOLS = [WEATHER, TIME]
PARIS = ToolCall("get_weather", {"city": "Paris", "days": 2}, "call_paris")
CET = ToolCall("get_time", {"zone": "CET"}, "call_cet")


def calls_read(calls):
    """Calls without their ids, to compare what a reply called."""
    return [(c.name, c.arguments) for c in calls]
