"""A stand-in for an OpenAI-compatible chat-completions endpoint, so the example runs
offline: it checks the weather, takes a note, then answers.

    python fake_openai.py [PORT]     # default 8765; prints "listening PORT"
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reply(messages):
    done = [m for m in messages if m["role"] == "tool"]
    city = messages[1]["content"].split()[-1].strip(".?!")
    if len(done) == 0:
        call = {"name": "weather", "arguments": json.dumps({"city": city})}
    elif len(done) == 1:
        call = {"name": "note", "arguments": json.dumps({"text": f"{city}: {done[0]['content']}"})}
    else:
        return {"role": "assistant", "content": f"Trip to {city} planned; weather: {done[0]['content']}."}
    call_id = f"call_{len(done) + 1}"
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": call}]}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = json.dumps({
            "choices": [{"index": 0, "message": reply(body["messages"]), "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8765), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()
