"""Pure policies of the AI-tool endpoints: extractive summaries, structured
actions (template filling, constraint checks), token accounting. The gateway's
services/gateway/ai_tool_calls.py does the I/O around them."""
