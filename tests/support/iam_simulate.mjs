// Evaluates IAM requests with @cloud-copilot/iam-simulate (installed in .tools/iam-simulate
// by `make .tools/iam-simulate`): reads a JSON array of requests on standard input, writes
// one answer per request on standard output (tests/support/iam_policies.py builds both).
//
// A request: {principal, action, resource, account, context, identity: [{name, policy}],
// session (a session policy or null), resourcePolicy (or null)}. An answer: {result
// ("Allowed", "ImplicitlyDenied", "ExplicitlyDenied" or "Error"), allowedBy (the identity
// statements that allow it, "policy name/Sid"), errors}.
import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'

const require = createRequire(process.env.IAM_SIMULATE_MODULES + '/')
const { runSimulation } = require('@cloud-copilot/iam-simulate')

const requests = JSON.parse(readFileSync(0, 'utf8'))
const answers = []
for (const request of requests) {
  const simulation = {
    request: {
      principal: request.principal,
      action: request.action,
      resource: { resource: request.resource, accountId: request.account },
      contextVariables: request.context,
    },
    identityPolicies: request.identity,
    serviceControlPolicies: [],
    resourceControlPolicies: [],
  }
  if (request.session) simulation.sessionPolicy = request.session
  if (request.resourcePolicy) simulation.resourcePolicy = request.resourcePolicy
  const response = await runSimulation(simulation, {})
  if (response.resultType === 'error') {
    answers.push({ result: 'Error', allowedBy: [], errors: response.errors })
    continue
  }
  const analysis = response.result.analysis
  const allowedBy = (analysis?.identityAnalysis?.allowStatements ?? []).map((statement) => {
    const explain = statement.explain ?? {}
    return `${statement.policyId}/${explain.identifier ?? '?'}`
  })
  answers.push({ result: response.overallResult, allowedBy, errors: null })
}
process.stdout.write(JSON.stringify(answers))
