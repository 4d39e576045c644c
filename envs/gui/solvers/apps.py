"""Planners for the small apps: the email inbox family, copy and paste, counting blocks, ordering numbers.

Each value is the body of a JS function run with :data:`~.prelude.PRELUDE_JS`; it returns the next steps.
The app planners are state-based: they look at which screen is open (inbox, email, reply form) and return
the steps for that screen, so the solver's re-planning walks through the app.
"""

from __future__ import annotations

__all__ = ["PLANNERS"]

# The email inbox: what to do comes from the utterance (or, for the natural-language variants, from MiniWoB's
# own fields of it); then open the sender's email and act on the screen that is open.
_EMAIL = r"""
  let task = FIELDS.task, by = FIELDS.by, to = FIELDS.to, message = FIELDS.message;
  let m;
  if (!by && (m = U.match(/^Find the email by (.+?) and (.*)$/))) {
    by = m[1];
    if ((m = m[2].match(/reply to them with the text "(.*)"/))) { task = 'reply'; message = m[1]; }
    else if ((m = U.match(/forward that email to (.+)\.$/))) { task = 'forward'; to = m[1]; }
    else task = /trash/.test(U) ? 'delete' : 'important';
  }
  if (!task) task = to ? 'forward' : message !== undefined ? 'reply' : fail('cannot read the task: ' + U);
  if (task === 'star') task = 'important';  // the natural-language variants' name for it
  const open = (id) => { const el = byId(id); return el && shown(el) && !el.classList.contains('hide') ? el : null; };
  // A form still sliding in has fields without a clickable point yet: plan again once it settles.
  const settled = (el) => !el || !!pointOf(el);
  // The field and the send button are planned together, so both must have a point.
  const form = (field, send, text) => (settled(field) && settled(send) ? [...fill(field, text), click(send)] : []);
  if (open('forward')) return form(document.querySelector('#forward .forward-sender'), byId('send-forward'), to);
  if (open('reply')) return form(byId('reply-text'), byId('send-reply'), message);
  const email = open('email');
  if (email) {
    if (txt(email.querySelector('.email-sender')) !== by) {
      const close = byId('close-email');
      return settled(close) ? [click(close)] : [];
    }
    const target = {delete: '.email-actions .trash', important: '.email-actions .star', reply: '.email-reply',
                    forward: '.email-forward'}[task];
    const button = email.querySelector(target);
    return settled(button) ? [click(button), wait(50)] : [];
  }
  const thread = $$('#main .email-thread').find((t) => txt(t.querySelector('.email-sender')) === by);
  if (!thread) fail('no email by ' + by);
  return [click(thread.querySelector('.email-sender')), wait(50)];
"""

# The social-media feed (#area scrolls): find the posts by the user and press the named control on them.
_SOCIAL = r"""
  const posts = (user) => $$('#area .media').filter((p) => txt(p.querySelector('.username')) === user);
  const CONTROL = {Reply: '.reply', Retweet: '.retweet', Like: '.like', Share: '.share'};
"""

PLANNERS: dict[str, str] = {
    "ascending-numbers": r"""
  // The numbers hide behind blank squares once "1" is clicked: note where each one was first.
  const texts = $$('#area_svg text');
  if (texts.length) {
    memory.at = {};
    for (const t of texts) memory.at[txt(t)] = centre(t).map(Math.round);
    return [click(texts.find((t) => txt(t) === '1'))];
  }
  memory.next = (memory.next || 1) + 1;
  return [clickAt(...memory.at[String(memory.next)])];
""",
    "buy-ticket": r"""
  // Read each ticket's duration ("3h 43m") and price ("Book for $459"); book the one the utterance asks for.
  const want = U.match(/^Buy the ticket with the (.+)\.$/)[1];
  const tickets = $$('#area .flight').map((f) => {
    const [h, m] = txt(f.querySelector('.time-duration')).match(/\d+/g).map(Number);
    const button = f.querySelector('.buy-ticket');
    return {button, minutes: 60 * h + m, price: Number(txt(button).match(/\$(\d+)/)[1])};
  });
  const key = {'cheapest cost': (t) => t.price, 'most expensive cost': (t) => -t.price,
               'shortest duration': (t) => t.minutes, 'longest duration': (t) => -t.minutes}[want];
  return [click(tickets.reduce((a, b) => (key(b) < key(a) ? b : a)).button)];
""",
    "copy-paste": r"""
  // Select the text area's text, copy it with the keyboard, paste it into the field.
  const answer = byId('answer-input');
  if (answer.value === byId('to-copy').value) return [click(byId('subbtn'))];
  return [click(byId('to-copy')), key('Control+a'), key('Control+c'), click(answer), key('Control+a'), key('Control+v')];
""",
    "copy-paste-2": r"""
  const index = ['1st', '2nd', '3rd'].indexOf(U.match(/from the (\w+) text area/)[1]) + 1;
  const source = byId('text-' + index), answer = byId('answer-input');
  if (answer.value === source.value) return [click(byId('subbtn'))];
  return [click(source), key('Control+a'), key('Control+c'), click(answer), key('Control+a'), key('Control+v')];
""",
    "email-inbox": _EMAIL,
    "email-inbox-delete": _EMAIL,
    "email-inbox-forward": _EMAIL,
    "email-inbox-forward-nl": _EMAIL,
    "email-inbox-forward-nl-turk": _EMAIL,
    "email-inbox-important": _EMAIL,
    "email-inbox-nl-turk": _EMAIL,
    "email-inbox-noscroll": _EMAIL,
    "email-inbox-reply": _EMAIL,
    "email-inbox-star-reply": _EMAIL,
    "generate-number": r"""
  // Press Generate until the shown number meets the condition, then Submit.
  const shownNumber = txt(byId('display-number'));
  const n = Number(shownNumber), m = U.match(/(less|greater) than (\d+)/);
  const good = shownNumber !== '-' && shownNumber !== '' && (
    m ? (m[1] === 'less' ? n < Number(m[2]) : n > Number(m[2])) : /odd/.test(U) ? Math.abs(n) % 2 === 1 : n % 2 === 0);
  return [click(byId(good ? 'submit' : 'generate'))];
""",
    "navigate-tree": r"""
  // Open the collapsed folders above the file (outermost first), then click it.
  const target = $$('#tree span').filter((sp) => txt(sp) === Q[0]).sort((a, b) => $$('ul', b).length - $$('ul', a).length)
    .find(shown) || $$('#tree span').find((sp) => txt(sp) === Q[0]);
  if (shown(target) && pointOf(target)) return [click(target)];
  const folders = [];
  for (let li = target.parentElement.parentElement.closest('li'); li; li = li.parentElement.closest('li')) folders.unshift(li);
  const isOpen = (li) => { const ul = li.querySelector(':scope > ul'); return shown(ul) && getComputedStyle(ul).display !== 'none'; };
  const closed = folders.find((li) => !isOpen(li));
  return closed ? [click(closed.querySelector(':scope > span')), wait(100)] : [click(target)];
""",
    "order-food": r"""
  // "Order one of each item: A, B" or "Order 3 items that are vegan" (each dish shows its kinds as icons).
  const items = $$('#area .food-item');
  const name = (it) => txt(it.querySelector('.item-name'));
  const count = (it) => Number(txt(it.querySelector('.quantity')) || 0);
  const order = byText('#area button', 'Order!');
  const byName = U.match(/^Order one of each item: (.*)$/);
  if (byName) {
    const wanted = byName[1].split(', ');
    const todo = items.find((it) => wanted.includes(name(it)) && count(it) < 1);
    return todo ? [click(todo.querySelector('.add'))] : [click(order)];
  }
  const [, n, kind] = U.match(/^Order (\d+) items that are (.+)$/);
  const dish = items.find((it) => $$('.types img', it).some((img) => img.alt === kind));
  return count(dish) < Number(n) ? [click(dish.querySelector('.add'))] : [click(order)];
""",
    "phone-book": r"""
  // Page through the contacts with ">" until the person shows, then click the asked property.
  const [, person, property] = U.match(/^Find (.+) in the contact book and click on their (\w+)/);
  if (txt(document.querySelector('#contact .name')) !== person) return [click(byText('#pagination a', '>'))];
  return [click(document.querySelector('#contact a.' + property))];
""",
    "search-engine": r"""
  const n = parseInt(U.match(/click the (\d+)/)[1], 10);
  const input = byId('search-text');
  if (input.value !== Q[0] || !$$('#page-content a').length) return [...fill(input, Q[0]), click(byId('search')), wait(50)];
  const page = Math.floor((n - 1) / 3) + 1;
  const active = document.querySelector('#pagination li.active');
  if (Number(txt(active)) !== page) return [click(byText('#pagination a', String(page))), wait(50)];
  return [click($$('#page-content a.search-title')[(n - 1) % 3])];
""",
    "social-media": _SOCIAL + r"""
  const [, user, action] = U.match(/^For the user (\S+), click on the "(.+)" button\.$/);
  const post = posts(user)[0];
  if (CONTROL[action]) return [click(post.querySelector(CONTROL[action]))];
  const menu = post.querySelector('ul');  // the other actions sit in the post's "more" menu
  if (menu.classList.contains('hide')) return [click(post.querySelector('.more'))];
  return [click($$('li', menu).find((li) => txt(li).startsWith(action)))];
""",
    "social-media-all": _SOCIAL + r"""
  const [, action, user] = U.match(/^Click the "(.+)" button on all posts by (\S+) and then click Submit\.$/);
  const todo = posts(user).map((p) => p.querySelector(CONTROL[action])).filter((c) => !c.classList.contains('active'));
  return todo.length ? [click(todo[0])] : [click(byText('#area button', 'Submit'))];
""",
    "social-media-some": _SOCIAL + r"""
  const [, action, count, user] = U.match(/^Click the "(.+)" button on (\d+) posts? by (\S+) and then click Submit\.$/);
  const controls = posts(user).map((p) => p.querySelector(CONTROL[action]));
  const done = controls.filter((c) => c.classList.contains('active')).length;
  if (done < Number(count)) return [click(controls.find((c) => !c.classList.contains('active')))];
  return [click(byText('#area button', 'Submit'))];
""",
    "scroll-text-2": r"""
  const area = byId('text-area'), r = area.getBoundingClientRect();
  const down = /to the bottom/.test(U);
  const atEnd = down ? area.scrollTop + area.clientHeight >= area.scrollHeight - 2 : area.scrollTop === 0;
  if (atEnd) return [click(byId('subbtn'))];
  return [{scroll: [Math.round(r.left + r.width / 2), Math.round(r.top + r.height / 2), (down ? 1 : -1) * area.scrollHeight]}];
""",
    "scroll-text": r"""
  const words = byId('text-area').value.trim().split(/\s+/);
  return [...fill(byId('answer-input'), words[words.length - 1].replace(/[^a-zA-Z0-9]/g, '')), click(byId('subbtn'))];
""",
    "terminal": r"""
  // List the files with ls, then rm one with the asked extension (or none).
  const m = U.match(/extension \.(\S+)$/), ext = m ? m[1] : null;
  const lines = $$('#terminal-contents > div');
  const listed = lines.findIndex((l) => txt(l.querySelector('.command')) === 'ls');
  if (listed < 0) return [click(byId('terminal')), type('ls\n'), wait(50)];
  const files = txt(lines[listed + 1]).split(' ');
  const file = files.find((f) => (ext ? f.endsWith('.' + ext) : !f.includes('.')));
  return [type('rm ' + file + '\n')];
""",
    "visual-addition": r"""
  const count = (id) => $$('#' + id + ' .addition-block').length;
  return [...fill(byId('math-answer'), String(count('visual-1') + count('visual-2'))), click(byId('subbtn'))];
""",
}
