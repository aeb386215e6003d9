#!/usr/bin/env python3
"""notes: an external beige plugin in Python, standard library only.

The gateway starts this file (`run` in plugin.json) with the plugin folder as its working
directory and talks JSON-RPC 2.0 with it over stdin/stdout, one JSON message per line, in
both directions. stdout carries only protocol messages; anything for humans goes to
stderr (it ends up in the gateway log) or through the `log` notification.

What it does:
  * a tool `notes` (`notes add <text>`, `notes list`, `notes clear`) that stores each
    agent's notes in the gateway's store with `kv.get` / `kv.set` requests, and tells
    which agent, session and (merged per-agent) config each call arrived with;
  * a `prePrompt` hook that rewrites "colour" to "color" and blocks messages that
    mention "forbidden".

docs/external-plugins.md walks through this file.
"""

import base64
import json
import sys
import traceback

USAGE = """Usage:
  notes add <text...>   add a note (or pipe the text on stdin)
  notes list            print the notes, numbered
  notes clear           delete all notes
"""

_next_id = 0
# Requests from the gateway that arrived while we were waiting for one of our answers.
_backlog = []


def send(message):
    """Write one message as one line (json.dumps never emits a raw newline)."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def receive():
    """The next message from the gateway, or None when it closed our stdin."""
    if _backlog:
        return _backlog.pop(0)
    line = sys.stdin.readline()
    return json.loads(line) if line else None


def gateway(method, **params):
    """Send a request to the gateway and wait for its answer."""
    global _next_id
    _next_id += 1
    my_id = "notes-%d" % _next_id
    send({"jsonrpc": "2.0", "id": my_id, "method": method, "params": params})
    while True:
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        message = json.loads(line)
        if "method" in message:  # a request for us: handle it after this one
            _backlog.append(message)
        elif message.get("id") == my_id:
            if "error" in message:
                raise RuntimeError("%s failed: %s" % (method, message["error"]["message"]))
            return message.get("result")


def log(level, message):
    """A notification (no id): the gateway logs it under this plugin's name."""
    send({"jsonrpc": "2.0", "method": "log", "params": {"level": level, "message": message}})


# ---- the methods the gateway calls ----


def initialize(params):
    log("info", "notes %s starting; plugin config %s" % (
        params.get("gatewayVersion"), json.dumps(params.get("config"))))
    return {
        "tools": [{
            "name": "notes",
            "description": "Keep short notes across sessions: notes add <text>, notes list, notes clear.",
            "commands": ["notes add <text...>", "notes list", "notes clear"],
        }],
        "hooks": ["prePrompt"],
        "skills": [],
    }


def tool_call(params):
    args = params.get("args") or []
    session = params["session"]
    config = params.get("config") or {}  # plugins.notes.config merged with the agent's pluginConfigs.notes
    agent = session["agent"]              # set by the gateway from the socket: trustworthy
    seen = "[agent=%s session=%s channel=%s config=%s]" % (
        agent, session["key"], session["channel"], json.dumps(config, sort_keys=True))

    if args[:1] == ["add"]:
        text = " ".join(args[1:])
        if not text and params.get("stdin"):
            text = base64.b64decode(params["stdin"]).decode("utf-8", "replace").strip()
        if not text:
            return {"output": "notes: nothing to add\n" + USAGE, "exitCode": 2}
        notes = gateway("kv.get", key="notes", scope=agent) or []
        limit = config.get("maxNotes", 100)
        if len(notes) >= limit:
            return {"output": "notes: the limit of %d notes is reached (maxNotes)\n" % limit, "exitCode": 1}
        notes.append(text)
        gateway("kv.set", key="notes", value=notes, scope=agent)
        return {"output": "added note %d %s\n" % (len(notes), seen), "exitCode": 0}

    if args == ["list"]:
        notes = gateway("kv.get", key="notes", scope=agent) or []
        label = config.get("label")
        head = "%s\n" % label if label else ""
        return {"output": head + "".join("%d. %s\n" % (i + 1, n) for i, n in enumerate(notes)), "exitCode": 0}

    if args == ["clear"]:
        gateway("kv.del", key="notes", scope=agent)
        return {"output": "", "exitCode": 0}

    return {"output": USAGE, "exitCode": 0 if args in ([], ["help"], ["--help"]) else 2}


def pre_prompt(params):
    """prePrompt: return {} to pass, {"message": …} to rewrite, {"block": true, "reason": …} to stop."""
    message = params["event"]["message"]
    if "forbidden" in message.lower():
        return {"block": True, "reason": "The notes plugin blocked this message: it mentions something forbidden."}
    if "colour" in message or "Colour" in message:
        return {"message": message.replace("colour", "color").replace("Colour", "Color")}
    return {}


HANDLERS = {
    "initialize": initialize,
    "tool.call": tool_call,
    "hook.prePrompt": pre_prompt,
}


def main():
    while True:
        message = receive()
        if message is None:
            return  # the gateway closed our stdin: exit
        method, request_id = message.get("method"), message.get("id")
        if method == "shutdown":
            send({"jsonrpc": "2.0", "id": request_id, "result": None})
            return
        handler = HANDLERS.get(method)
        if handler is None:
            if request_id is not None:
                send({"jsonrpc": "2.0", "id": request_id,
                      "error": {"code": -32601, "message": "unknown method %s" % method}})
            continue
        try:
            result = handler(message.get("params") or {})
        except Exception as e:  # report it to the caller and keep serving
            traceback.print_exc(file=sys.stderr)
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": str(e)}})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__":
    main()
