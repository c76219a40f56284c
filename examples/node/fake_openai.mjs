// A stand-in for an OpenAI-compatible chat-completions endpoint, so the example runs offline:
// it checks the weather, takes a note, then answers.
//
//   node fake_openai.mjs [PORT]     # default 8765; prints "listening PORT"
import http from 'node:http'

function reply(messages) {
  const done = messages.filter((m) => m.role === 'tool')
  const city = messages[1].content.split(' ').at(-1).replace(/[.?!]+$/, '')
  let call
  if (done.length === 0) call = { name: 'weather', arguments: JSON.stringify({ city }) }
  else if (done.length === 1) call = { name: 'note', arguments: JSON.stringify({ text: `${city}: ${done[0].content}` }) }
  else return { role: 'assistant', content: `Trip to ${city} planned; weather: ${done[0].content}.` }
  return { role: 'assistant', content: null, tool_calls: [{ id: `call_${done.length + 1}`, type: 'function', function: call }] }
}

const server = http.createServer((req, res) => {
  let body = ''
  req.on('data', (chunk) => (body += chunk))
  req.on('end', () => {
    const answer = JSON.stringify({
      choices: [{ index: 0, message: reply(JSON.parse(body).messages), finish_reason: 'stop' }],
      usage: { prompt_tokens: 50, completion_tokens: 10 },
    })
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) })
    res.end(answer)
  })
})
server.listen(Number(process.argv[2] ?? 8765), '127.0.0.1', () => console.log(`listening ${server.address().port}`))
